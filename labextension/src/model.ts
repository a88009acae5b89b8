/**
 * The jobs as the sidebar and the status bar see them: polled from the server with
 * backoff on errors, paused while the page is hidden (as dask-labextension does), and
 * each live job's images/sec series, a point per poll.
 */

import { Poll } from '@lumino/polling';
import { ISignal, Signal } from '@lumino/signaling';

import { FINAL_STATES, IJob, listJobs } from './api';
import { RateSeries } from './series';

export const POLL_MS = 2000;
const MAX_POLL_MS = 30000;

export class JobsModel {
  constructor(interval = POLL_MS) {
    this._poll = new Poll({
      auto: true,
      factory: () => this._refresh(),
      frequency: JobsModel._frequency(interval),
      name: 'jupyter-distrain:jobs',
      standby: 'when-hidden'
    });
  }

  get changed(): ISignal<this, void> {
    return this._changed;
  }

  get jobs(): IJob[] {
    return this._jobs;
  }

  /** The last poll's error ('' when it worked). */
  get error(): string {
    return this._error;
  }

  get running(): IJob[] {
    return this._jobs.filter(j => !FINAL_STATES.includes(j.state));
  }

  get finished(): IJob[] {
    return this._jobs.filter(j => FINAL_STATES.includes(j.state));
  }

  series(id: string): number[] {
    return this._series.get(id)?.points ?? [];
  }

  /** Milliseconds between polls (the `pollInterval` setting). */
  get interval(): number {
    return this._poll.frequency.interval;
  }

  set interval(ms: number) {
    this._poll.frequency = JobsModel._frequency(ms);
  }

  /** Poll now (after an action), rather than at the next tick. */
  refresh(): Promise<void> {
    return this._poll.refresh();
  }

  dispose(): void {
    this._poll.dispose();
  }

  private static _frequency(interval: number) {
    return { interval, backoff: true, max: Math.max(MAX_POLL_MS, interval) };
  }

  private async _refresh(): Promise<void> {
    try {
      this._jobs = await listJobs();
      this._error = '';
    } catch (err) {
      this._error = (err as Error).message;
      this._changed.emit();
      throw err; // the poll backs off
    }
    for (const job of this.running) {
      let series = this._series.get(job.id);
      if (!series) {
        series = new RateSeries();
        this._series.set(job.id, series);
      }
      series.add(job.images_per_sec);
    }
    for (const id of this._series.keys()) {
      if (!this._jobs.some(j => j.id === id)) {
        this._series.delete(id);
      }
    }
    this._changed.emit();
  }

  private _changed = new Signal<this, void>(this);
  private _error = '';
  private _jobs: IJob[] = [];
  private _poll: Poll;
  private _series = new Map<string, RateSeries>();
}

/** `1234.5` as `1.2k`. */
export function rateText(rate: number): string {
  return rate >= 1000 ? `${(rate / 1000).toFixed(1)}k` : rate.toFixed(0);
}

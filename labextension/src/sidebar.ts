/** The "Distributed jobs" left sidebar: one row per job, updated in place each poll. */

import type { LabIcon } from '@jupyterlab/ui-components';
import { Widget } from '@lumino/widgets';

import { FINAL_STATES, IJob } from './api';
import { JobsModel, rateText } from './model';
import { sparkline } from './series';

export interface IJobActions {
  scale(job: IJob): void;
  stop(job: IJob): void;
  logs(job: IJob): void;
  stacks(job: IJob): void;
  attach(job: IJob): void;
  removeFinished(): void;
}

export const REMOVE_FINISHED_LABEL = 'Remove finished jobs';

function element(tag: string, className: string, text = ''): HTMLElement {
  const node = document.createElement(tag);
  node.className = className;
  node.textContent = text;
  return node;
}

class JobRow {
  readonly node = element('li', 'jp-distrain-job');

  constructor(
    job: IJob,
    private _actions: IJobActions
  ) {
    this.job = job;
    this.node.dataset.jobId = job.id;
    const head = element('div', 'jp-distrain-job-head');
    head.append(this._name, this._state);
    const buttons = element('div', 'jp-distrain-job-buttons');
    for (const [label, act] of [
      ['Scale', () => this._actions.scale(this.job)],
      ['Stop', () => this._actions.stop(this.job)],
      ['Logs', () => this._actions.logs(this.job)],
      ['Stacks', () => this._actions.stacks(this.job)],
      ['Attach', () => this._actions.attach(this.job)]
    ] as [string, () => void][]) {
      const button = element('button', 'jp-Button jp-mod-styled jp-mod-reject', label);
      button.dataset.action = label.toLowerCase();
      button.addEventListener('click', act);
      buttons.appendChild(button);
      this._buttons[label.toLowerCase()] = button as HTMLButtonElement;
    }
    const rate = element('div', 'jp-distrain-job-rate');
    rate.append(this._rate, this._chart);
    this.node.append(head, this._detail, rate, this._error, buttons);
  }

  job: IJob;

  update(job: IJob, series: number[]): void {
    this.job = job;
    const live = !FINAL_STATES.includes(job.state);
    this.node.dataset.state = job.state;
    this._name.textContent = job.session
      ? `session ${job.session} (${job.id})`
      : job.name && !job.id.startsWith(job.name)
        ? `${job.name} (${job.id})`
        : job.id;
    this._name.title = job.id;
    this._state.textContent = job.state;
    this._state.className = `jp-distrain-state jp-distrain-state-${job.state}`;
    const scaling = job.scaling_to ? ` -> ${job.scaling_to}` : '';
    const ps = job.ps ? `, ${job.ps} ps` : '';
    const restarts = job.restarts ? ` · restart ${job.restarts} of ${job.max_restarts}` : '';
    this._detail.textContent = `${job.backend} / ${job.launcher} · workers ${job.workers_up}/${job.workers}${scaling}${ps}${restarts}`;
    this._rate.textContent = live ? `${rateText(job.images_per_sec)} img/s` : '';
    this._chart.replaceChildren(...(live && series.length > 1 ? [sparkline(series)] : []));
    this._error.textContent = job.error ?? '';
    // a session's variables live in its ranks: a resize would restart them
    this._buttons.scale.disabled = !live || !!job.session;
    this._buttons.scale.title = job.session ? "a session's size stays as it started" : '';
    this._buttons.stop.disabled = !live;
  }

  private _buttons: { [action: string]: HTMLButtonElement } = {};
  private _chart = element('span', 'jp-distrain-job-chart');
  private _detail = element('div', 'jp-distrain-job-detail');
  private _error = element('div', 'jp-distrain-job-error');
  private _name = element('span', 'jp-distrain-job-name');
  private _rate = element('span', 'jp-distrain-job-images');
  private _state = element('span', 'jp-distrain-state');
}

export class JobsSidebar extends Widget {
  constructor(
    private _model: JobsModel,
    private _actions: IJobActions,
    removeIcon?: Pick<LabIcon, 'element'>
  ) {
    super();
    this.addClass('jp-distrain-sidebar');
    const header = element('div', 'jp-distrain-header');
    const title = element('h2', 'jp-distrain-title', 'Distributed jobs');
    const toolbar = element('div', 'jp-distrain-toolbar');
    this._removeFinished.className = 'jp-ToolbarButtonComponent jp-distrain-toolbar-button';
    this._removeFinished.dataset.action = 'remove-finished';
    this._removeFinished.title = REMOVE_FINISHED_LABEL;
    this._removeFinished.setAttribute('aria-label', REMOVE_FINISHED_LABEL);
    if (removeIcon) {
      this._removeFinished.append(removeIcon.element({ tag: 'span' }));
    } else {
      this._removeFinished.textContent = REMOVE_FINISHED_LABEL;
    }
    this._removeFinished.addEventListener('click', () => this._actions.removeFinished());
    toolbar.append(this._removeFinished);
    header.append(title, toolbar);
    this.node.append(header, this._status, this._list);
    _model.changed.connect(this._render, this);
    this._render();
  }

  dispose(): void {
    this._model.changed.disconnect(this._render, this);
    super.dispose();
  }

  private _render(): void {
    const jobs = this._model.jobs;
    this._status.textContent = this._model.error
      ? `Cannot list the jobs: ${this._model.error}`
      : jobs.length
        ? ''
        : 'No jobs yet: run a cell with %%distributed --workers 2';
    this._removeFinished.disabled = this._model.finished.length === 0;
    const seen = new Set<string>();
    jobs.forEach((job, i) => {
      seen.add(job.id);
      let row = this._rows.get(job.id);
      if (!row) {
        row = new JobRow(job, this._actions);
        this._rows.set(job.id, row);
      }
      row.update(job, this._model.series(job.id));
      if (this._list.children[i] !== row.node) {
        this._list.insertBefore(row.node, this._list.children[i] ?? null);
      }
    });
    for (const [id, row] of this._rows) {
      if (!seen.has(id)) {
        row.node.remove();
        this._rows.delete(id);
      }
    }
  }

  private _list = element('ul', 'jp-distrain-jobs');
  private _removeFinished = document.createElement('button');
  private _rows = new Map<string, JobRow>();
  private _status = element('div', 'jp-distrain-sidebar-status');
}

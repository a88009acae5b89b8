/**
 * A job's aggregate images/sec over time, from its metric records as they come (the
 * metrics route read incrementally): each process's latest rate, summed per second.
 */

import { IMetricRecord } from './api';

const STALE_SECONDS = 10; // a process unheard for this long no longer counts

export class RateSeries {
  constructor(readonly capacity = 60) {}

  /** The byte offset of metrics.jsonl to read from next. */
  since = 0;

  get points(): number[] {
    return this._points.map(p => p[1]);
  }

  add(records: IMetricRecord[]): void {
    for (const r of records) {
      if (typeof r.images_per_sec !== 'number' || typeof r.time !== 'number') {
        continue;
      }
      this._latest.set(`${r.role}-${r.index}`, [r.time, r.images_per_sec]);
      const second = Math.floor(r.time);
      let total = 0;
      for (const [key, [time, rate]] of this._latest) {
        if (r.time - time > STALE_SECONDS) {
          this._latest.delete(key);
        } else {
          total += rate;
        }
      }
      const last = this._points[this._points.length - 1];
      if (last && last[0] >= second) {
        last[1] = total;
      } else {
        this._points.push([second, total]);
      }
    }
    this._points.splice(0, Math.max(0, this._points.length - this.capacity));
  }

  private _latest = new Map<string, [number, number]>();
  private _points: [number, number][] = [];
}

/** An SVG polyline of `values`, scaled to `width` x `height`. */
export function sparkline(values: number[], width = 120, height = 24): SVGSVGElement {
  const ns = 'http://www.w3.org/2000/svg';
  const svg = document.createElementNS(ns, 'svg');
  svg.setAttribute('width', String(width));
  svg.setAttribute('height', String(height));
  svg.setAttribute('viewBox', `0 0 ${width} ${height}`);
  svg.classList.add('jp-distrain-sparkline');
  if (values.length > 1) {
    const max = 1.25 * Math.max(...values) || 1; // a steady rate sits below the top
    const step = width / (values.length - 1);
    const points = values
      .map(
        (v, i) => `${(i * step).toFixed(1)},${(height - 1 - (v / max) * (height - 2)).toFixed(1)}`
      )
      .join(' ');
    const line = document.createElementNS(ns, 'polyline');
    line.setAttribute('points', points);
    svg.appendChild(line);
  }
  return svg;
}

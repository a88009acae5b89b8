/**
 * A job's images/sec over time, one point per poll of the jobs list: the rate the job's
 * model says (its live processes' latest rates, summed by the server). Reading every
 * metric record instead grew with the job's size (a 128-rank job writes ~1,300 records
 * a second, more than a poll's bounded read at 512 ranks).
 */
export class RateSeries {
  constructor(readonly capacity = 60) {}

  get points(): number[] {
    return this._points.slice();
  }

  add(rate: number): void {
    this._points.push(rate);
    this._points.splice(0, Math.max(0, this._points.length - this.capacity));
  }

  private _points: number[] = [];
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

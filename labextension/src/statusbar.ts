/** The status bar item: running jobs and their total images/sec; a click opens the sidebar. */

import { Widget } from '@lumino/widgets';

import { JobsModel, rateText } from './model';

export class JobsStatus extends Widget {
  constructor(
    private _model: JobsModel,
    onClick: () => void
  ) {
    super();
    this.addClass('jp-distrain-status');
    this.node.title = 'Distributed jobs: click to show them';
    this.node.addEventListener('click', onClick);
    _model.changed.connect(this._render, this);
    this._render();
  }

  dispose(): void {
    this._model.changed.disconnect(this._render, this);
    super.dispose();
  }

  private _render(): void {
    const running = this._model.running;
    const rate = running.reduce((sum, j) => sum + (j.images_per_sec || 0), 0);
    const jobs = `${running.length} distributed job${running.length === 1 ? '' : 's'}`;
    this.node.textContent = running.length ? `${jobs} · ${rateText(rate)} img/s` : jobs;
  }
}

/** A main-area panel following one job's log live: a process selector, then the log
 * read incrementally (`offset`) every second while the panel is visible. */

import { MainAreaWidget } from '@jupyterlab/apputils';
import { Poll } from '@lumino/polling';
import { Widget } from '@lumino/widgets';

import { getLogs } from './api';

const MAX_READS = 200; // the reads kept in the panel; older ones are dropped

class LogView extends Widget {
  constructor(readonly jobId: string) {
    super({ node: document.createElement('pre') });
    this.addClass('jp-distrain-log');
    this._poll = new Poll({
      auto: true,
      factory: () => this._read(),
      frequency: { interval: 1000, backoff: true, max: 15000 },
      name: `jupyter-distrain:logs:${jobId}`,
      standby: () => !this.isVisible || 'when-hidden' // a hidden tab or page: no reads
    });
  }

  readonly select = document.createElement('select');
  /** One line: why the last read failed ('' when it worked). */
  readonly status = document.createElement('span');

  follow(process: string): void {
    this._process = process;
    this._offset = null;
    this.node.textContent = '';
    void this._poll.refresh();
  }

  dispose(): void {
    this._poll.dispose();
    super.dispose();
  }

  private async _read(): Promise<void> {
    const query: Record<string, string | number> =
      this._offset === null ? { tail: 200 } : { offset: this._offset };
    if (this._process) {
      query.process = this._process;
    }
    const process = this._process;
    let answer;
    try {
      answer = await getLogs(this.jobId, query);
    } catch (err) {
      this._status((err as Error).message);
      throw err;
    }
    this._status('');
    if (process !== this._process) {
      return; // the selection changed while reading
    }
    this._process = answer.process;
    this._offset = answer.offset;
    this._options(answer.processes, answer.process);
    if (answer.lines.length) {
      const atEnd = this.node.scrollTop + this.node.clientHeight >= this.node.scrollHeight - 4;
      this.node.appendChild(document.createTextNode(answer.lines.join('\n') + '\n'));
      while (this.node.childNodes.length > MAX_READS) {
        this.node.firstChild!.remove();
      }
      if (atEnd) {
        this.node.scrollTop = this.node.scrollHeight;
      }
    }
  }

  private _options(processes: string[], selected: string): void {
    const current = [...this.select.options].map(o => o.value);
    if (current.join() !== processes.join()) {
      this.select.replaceChildren(
        ...processes.map(p =>
          Object.assign(document.createElement('option'), { value: p, text: p })
        )
      );
    }
    this.select.value = selected;
  }

  private _status(message: string): void {
    this.status.textContent = message;
  }

  private _offset: number | null = null;
  private _poll: Poll;
  private _process = '';
}

export function logsPanel(jobId: string): MainAreaWidget<LogView> {
  const content = new LogView(jobId);
  const panel = new MainAreaWidget({ content });
  panel.id = `jp-distrain-logs-${jobId}`;
  panel.title.label = `Logs: ${jobId}`;
  panel.title.closable = true;
  panel.addClass('jp-distrain-logs');
  content.select.className = 'jp-distrain-log-process';
  content.select.setAttribute('aria-label', 'Process');
  content.select.addEventListener('change', () => content.follow(content.select.value));
  content.status.className = 'jp-distrain-log-status';
  panel.toolbar.addItem('process', new Widget({ node: content.select }));
  panel.toolbar.addItem('status', new Widget({ node: content.status }));
  return panel;
}

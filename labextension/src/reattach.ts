/**
 * The job a `%%distributed` cell started, kept in the cell's metadata
 * (`jupyter_distrain.client.job`, from the magic's "Job ID: ..." line); when a notebook opens
 * with a cell whose job still runs, an offer to reattach to it.
 */

import { Notification } from '@jupyterlab/apputils';
import { Cell, CodeCell } from '@jupyterlab/cells';
import { INotebookTracker, NotebookActions, NotebookPanel } from '@jupyterlab/notebook';

import { insertAttachCell } from './actions';
import { FINAL_STATES, IJob, requestAPI } from './api';
import { hasMagic } from './magicline';

export const METADATA_KEY = 'jupyter_distrain';
const JOB_LINE = /^Job ([A-Za-z0-9][A-Za-z0-9_.-]*): /m;

/** The job id in a cell's outputs (the magic's first line), or null. */
function jobInOutputs(cell: CodeCell): string | null {
  const outputs = cell.model.outputs;
  for (let i = 0; i < outputs.length; i++) {
    const output = outputs.get(i).toJSON() as { output_type: string; text?: string | string[] };
    if (output.output_type === 'stream') {
      const text = Array.isArray(output.text) ? output.text.join('') : (output.text ?? '');
      const match = JOB_LINE.exec(text);
      if (match) {
        return match[1];
      }
    }
  }
  return null;
}

/** From a `%%distributed` cell's run: record its job in the cell's metadata. */
function recordJob(cell: Cell): void {
  if (!(cell instanceof CodeCell) || !hasMagic(cell.model.sharedModel.getSource())) {
    return;
  }
  cell.model.deleteMetadata(METADATA_KEY); // a new run: a new job
  const outputs = cell.model.outputs;
  const look = () => {
    const job = cell.isDisposed ? null : jobInOutputs(cell);
    if (job || cell.isDisposed) {
      outputs.changed.disconnect(look);
    }
    if (job) {
      cell.model.setMetadata(METADATA_KEY, { job });
    }
  };
  outputs.changed.connect(look);
}

/** Offer to reattach to the still-running jobs of a notebook's cells. */
async function offerReattach(panel: NotebookPanel): Promise<void> {
  await panel.context.ready;
  const cells = panel.content.widgets;
  for (let index = 0; index < cells.length; index++) {
    const meta = cells[index].model.getMetadata(METADATA_KEY) as { job?: string } | undefined;
    if (!meta?.job) {
      continue;
    }
    const jobId = meta.job;
    let job: IJob;
    try {
      job = await requestAPI<IJob>(`jobs/${encodeURIComponent(jobId)}`);
    } catch {
      continue; // gone from the store
    }
    if (FINAL_STATES.includes(job.state)) {
      continue;
    }
    Notification.info(
      `Job ${jobId}, started by cell ${index + 1} of ${panel.context.localPath}, is still ${job.state}.`,
      {
        autoClose: false,
        actions: [
          {
            label: 'Reattach',
            caption: 'Insert a %distributed attach cell below it',
            callback: () => {
              const at = panel.content.widgets.findIndex(
                c => (c.model.getMetadata(METADATA_KEY) as { job?: string })?.job === jobId
              );
              insertAttachCell(panel.content, jobId, at < 0 ? undefined : at);
            }
          }
        ]
      }
    );
  }
}

export function trackJobs(tracker: INotebookTracker): void {
  NotebookActions.executionScheduled.connect((_, { cell }) => recordJob(cell));
  tracker.widgetAdded.connect((_, panel) => void offerReattach(panel));
}

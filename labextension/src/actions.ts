/** What the sidebar's buttons do: scale, stop, stacks, attach, remove the finished jobs. */

import { Dialog, InputDialog, showDialog, showErrorMessage } from '@jupyterlab/apputils';
import { INotebookTracker, Notebook, NotebookActions } from '@jupyterlab/notebook';
import { Widget } from '@lumino/widgets';

import { IJob, removeFinishedJobs, scaleJob, stopJob, takeStacks } from './api';

export async function scale(job: IJob): Promise<boolean> {
  const answer = await InputDialog.getNumber({
    title: `Scale ${job.id}`,
    label: 'Workers (the job restarts from its checkpoint with this many)',
    value: job.scaling_to ?? job.workers
  });
  if (!answer.button.accept || answer.value === null) {
    return false;
  }
  try {
    await scaleJob(job.id, answer.value);
    return true;
  } catch (err) {
    await showErrorMessage(`Cannot scale ${job.id}`, (err as Error).message);
    return false;
  }
}

export async function stop(job: IJob): Promise<boolean> {
  const answer = await showDialog({
    title: `Stop ${job.id}?`,
    body: `Every process of the job (${job.workers_up} running) is stopped.`,
    buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: 'Stop' })]
  });
  if (!answer.button.accept) {
    return false;
  }
  try {
    await stopJob(job.id);
    return true;
  } catch (err) {
    await showErrorMessage(`Cannot stop ${job.id}`, (err as Error).message);
    return false;
  }
}

/** Where every process of the job stands: its stacks taken now, grouped, in a dialog. */
export async function stacks(job: IJob): Promise<void> {
  let text: string;
  try {
    const report = await takeStacks(job.id);
    text = report.kept ? `The job has ended; the last stacks taken:\n${report.text}` : report.text;
  } catch (err) {
    await showErrorMessage(`No stacks of ${job.id}`, (err as Error).message);
    return;
  }
  const pre = document.createElement('pre');
  pre.className = 'jp-distrain-stacks';
  pre.textContent = text;
  await showDialog({
    title: `Stacks of ${job.id}`,
    body: new Widget({ node: pre }),
    buttons: [Dialog.okButton({ label: 'Close' })]
  });
}

/** Remove every finished job (its record, logs and metrics) after a confirmation. */
export async function removeFinished(finished: IJob[]): Promise<boolean> {
  const count = finished.length;
  const answer = await showDialog({
    title: `Remove ${count} finished job${count === 1 ? '' : 's'}?`,
    body: 'Their records, logs and metrics are deleted; running jobs stay.',
    buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: 'Remove' })]
  });
  if (!answer.button.accept) {
    return false;
  }
  try {
    await removeFinishedJobs();
    return true;
  } catch (err) {
    await showErrorMessage('Cannot remove the finished jobs', (err as Error).message);
    return false;
  }
}

/** A `%distributed attach ID` cell below the active cell of the current notebook. */
export async function attach(job: IJob, tracker: INotebookTracker): Promise<boolean> {
  const panel = tracker.currentWidget;
  if (!panel) {
    await showErrorMessage(
      `Cannot attach to ${job.id}`,
      'Open a notebook first: the attach cell goes below its active cell.'
    );
    return false;
  }
  insertAttachCell(panel.content, job.id);
  return true;
}

/** Insert `%distributed attach ID` below cell `index` (default: the active cell). */
export function insertAttachCell(notebook: Notebook, jobId: string, index?: number): void {
  if (index !== undefined) {
    notebook.activeCellIndex = index;
  }
  NotebookActions.insertBelow(notebook);
  notebook.activeCell?.model.sharedModel.setSource(`%distributed attach ${jobId}`);
}

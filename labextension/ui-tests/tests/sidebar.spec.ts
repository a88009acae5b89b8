/**
 * The "Distributed jobs" sidebar and status bar item against a real job started from a
 * notebook cell: listed with its workers and images/sec, scaled, its logs followed,
 * its stacks shown, attached to, and stopped with no process left; the finished jobs removed from the
 * header while a running one stays.
 */

import { expect } from '@jupyterlab/galata';
import * as path from 'path';

import {
  SHOTS,
  alive,
  cellSource,
  jobNamed,
  listJobs,
  openNotebook,
  processesMentioning,
  test
} from './helpers';

// runs until asked to checkpoint (a scale), then exits for the restart with N workers
const CHECKPOINTING = `%%distributed --workers 2 --backend plain --grace 2 --name ui-scale --background
import sys, time
from jupyter_distrain import CHECKPOINT_EXIT, report, should_checkpoint
print("up", flush=True)
for step in range(1, 6000):
    if should_checkpoint():
        sys.exit(CHECKPOINT_EXIT)
    time.sleep(0.1)
    report(step=step, images=32, seconds=0.1, loss=1.0 / step)
    if step % 10 == 0:
        print(f"step {step}", flush=True)
`;

const SHORT = (
  name: string
) => `%%distributed --workers 1 --backend plain --name ${name} --background
print("done", flush=True)
`;

// runs until stopped
const LONG = `%%distributed --workers 1 --backend plain --grace 2 --name ui-long --background
import time
for step in range(6000):
    time.sleep(0.1)
`;

test.use({ autoGoto: true });

test('a running job: listed, scaled, logs, attach, stopped', async ({ page, tmpPath }) => {
  test.setTimeout(180000);
  await openNotebook(page, tmpPath, 'jobs.ipynb', ['%load_ext jupyter_distrain', CHECKPOINTING]);
  await page.notebook.runCell(0, true);
  await page.notebook.runCell(1, true);
  const job = await jobNamed(page, 'ui-scale');

  const sidebar = page.locator('#jp-distrain-sidebar');
  const row = sidebar.locator(`li[data-job-id="${job.id}"]`);
  await test.step('the status bar item opens the sidebar, which lists the job', async () => {
    const status = page.locator('.jp-distrain-status');
    await expect(status).toContainText('1 distributed job');
    await status.click();
    await expect(sidebar).toBeVisible();
    await expect(row).toHaveAttribute('data-state', 'running', { timeout: 60000 });
    await expect(row.locator('.jp-distrain-job-detail')).toHaveText('plain / local · workers 2/2');
    await expect(row.locator('.jp-distrain-job-images')).toContainText('img/s');
    await expect(row.locator('.jp-distrain-sparkline polyline')).toHaveCount(1, {
      timeout: 30000
    });
    await expect(status).toContainText(/1 distributed job · \d+ img\/s/);
    await page.waitForTimeout(3000); // a few more points on the sparkline
    await page.screenshot({ path: path.join(SHOTS, 'sidebar.png') });
  });

  await test.step('Scale asks the worker count and the job restarts with it', async () => {
    await row.locator('button[data-action="scale"]').click();
    const dialog = page.locator('.jp-Dialog');
    await dialog.locator('input').fill('3');
    await dialog.locator('.jp-mod-accept').click();
    await expect(row.locator('.jp-distrain-job-detail')).toHaveText('plain / local · workers 3/3', {
      timeout: 90000
    });
    await expect(row).toHaveAttribute('data-state', 'running');
  });

  await test.step('Logs follows a process picked in the panel', async () => {
    await row.locator('button[data-action="logs"]').click();
    const panel = page.locator(`#jp-distrain-logs-${job.id}`);
    await expect(panel).toBeVisible();
    const select = panel.locator('select.jp-distrain-log-process');
    await expect(select.locator('option')).toHaveText(['worker-0', 'worker-1', 'worker-2'], {
      timeout: 30000
    });
    const log = panel.locator('pre');
    await expect(log).toContainText('up');
    await select.selectOption('worker-2');
    await expect(log).toContainText('up');
    // followed live: the lines written after the panel's first read appear
    await expect(log).toContainText('step 10');
    const lines = (await log.textContent())!.trim().split('\n');
    const last = Number(lines[lines.length - 1].replace('step ', ''));
    await expect(log).toContainText(`step ${last + 20}`, { timeout: 15000 });
    await expect(panel.locator('.jp-distrain-log-status')).toHaveText('');
    await page.notebook.activate('jobs.ipynb');
  });

  await test.step('Attach inserts the attach cell below the active cell', async () => {
    await page.notebook.selectCells(1);
    await row.locator('button[data-action="attach"]').click();
    expect(await cellSource(page, 2)).toBe(`%distributed attach ${job.id}`);
  });

  await test.step('Stacks shows where every process is, grouped, and the job runs on', async () => {
    await row.locator('button[data-action="stacks"]').click();
    const shown = page.locator('.jp-Dialog pre.jp-distrain-stacks');
    await expect(shown).toContainText(/^stacks of 3 processes at [\d:]+ \(request\)/, {
      timeout: 30000
    });
    await expect(shown).toContainText('train.py:');
    await page.screenshot({ path: path.join(SHOTS, 'stacks.png') });
    await page.locator('.jp-Dialog .jp-mod-accept').click();
    await expect(row).toHaveAttribute('data-state', 'running');
  });

  await test.step('Stop asks, then stops every process', async () => {
    const running = (await jobNamed(page, 'ui-scale')).processes;
    const pids = running.map(p => p.pid).filter((pid): pid is number => !!pid);
    expect(pids).toHaveLength(3);
    expect(processesMentioning(job.id).length).toBeGreaterThan(0); // its supervisor
    await row.locator('button[data-action="stop"]').click();
    await page.locator('.jp-Dialog .jp-mod-accept').click();
    await expect(row).toHaveAttribute('data-state', 'stopped', { timeout: 60000 });
    await expect(row.locator('button[data-action="stop"]')).toBeDisabled();
    expect(pids.filter(alive)).toEqual([]);
    await expect.poll(() => processesMentioning(job.id), { timeout: 30000 }).toEqual([]);
    await expect(page.locator('.jp-distrain-status')).toHaveText('0 distributed jobs');
  });
});

test('Remove finished jobs: the finished ones go, the running one stays', async ({
  page,
  tmpPath
}) => {
  test.setTimeout(180000);
  await openNotebook(page, tmpPath, 'clean.ipynb', [
    '%load_ext jupyter_distrain',
    SHORT('ui-short-a'),
    SHORT('ui-short-b'),
    LONG
  ]);
  for (let i = 0; i < 4; i++) {
    await page.notebook.runCell(i, true);
  }
  const [shortA, shortB, long] = [
    await jobNamed(page, 'ui-short-a'),
    await jobNamed(page, 'ui-short-b'),
    await jobNamed(page, 'ui-long')
  ];
  const sidebar = page.locator('#jp-distrain-sidebar');
  const row = (id: string) => sidebar.locator(`li[data-job-id="${id}"]`);
  const removeButton = sidebar.locator('button[data-action="remove-finished"]');
  await page.locator('.jp-distrain-status').click();
  await expect(sidebar).toBeVisible();

  await test.step('the button is enabled once a job is finished', async () => {
    await expect(row(long.id)).toHaveAttribute('data-state', 'running', { timeout: 60000 });
    for (const job of [shortA, shortB]) {
      await expect(row(job.id)).toHaveAttribute('data-state', /succeeded|exited/, {
        timeout: 60000
      });
    }
    await expect(removeButton).toBeEnabled();
    await expect(removeButton).toHaveAttribute('title', 'Remove finished jobs');
  });

  await test.step('Cancel keeps every job', async () => {
    await removeButton.click();
    const dialog = page.locator('.jp-Dialog');
    await expect(dialog).toContainText(/Remove \d+ finished jobs\?/);
    await dialog.locator('.jp-mod-reject').click();
    await expect(dialog).toHaveCount(0);
    const ids = (await listJobs(page)).map(j => j.id);
    expect(ids).toEqual(expect.arrayContaining([shortA.id, shortB.id, long.id]));
  });

  await test.step('Remove asks, then the finished jobs leave the list', async () => {
    await removeButton.click();
    await page.locator('.jp-Dialog .jp-mod-accept').click();
    await expect(row(shortA.id)).toHaveCount(0, { timeout: 30000 });
    await expect(row(shortB.id)).toHaveCount(0);
    await expect(row(long.id)).toHaveAttribute('data-state', 'running');
    const jobs = await listJobs(page);
    expect(jobs.map(j => j.id)).toEqual([long.id]);
    await expect(removeButton).toBeDisabled();
  });

  await test.step('the running job is then stopped', async () => {
    await row(long.id).locator('button[data-action="stop"]').click();
    await page.locator('.jp-Dialog .jp-mod-accept').click();
    await expect(row(long.id)).toHaveAttribute('data-state', 'stopped', { timeout: 60000 });
    await expect(removeButton).toBeEnabled();
    await expect.poll(() => processesMentioning(long.id), { timeout: 30000 }).toEqual([]);
  });
});

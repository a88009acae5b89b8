/**
 * Notebook 7 (the `notebook` project of playwright.config.js, under the same server and
 * base URL as JupyterLab): a %%distributed cell shows the live widget in the notebook
 * page, the Distributed jobs panel opens in Notebook 7's left area and lists the job,
 * and its Stop leaves no process.
 */

import { expect } from '@jupyterlab/galata';
import { Page } from '@playwright/test';
import * as path from 'path';

import { SHOTS, alive, jobNamed, notebookContent, processesMentioning, test } from './helpers';

const TRAIN = `%%distributed --workers 2 --backend plain --grace 2 --name nb7-job
import time
from jupyter_distrain import report
for step in range(1, 6000):
    time.sleep(0.1)
    report(step=step, images=32, seconds=0.1, loss=1.0 / step)
`;

test.use({
  autoGoto: false,
  // Notebook 7's pages have no launcher and no splash: its shell is the sign of a page up
  waitForApplication: async ({}, use) => {
    await use(async (page: Page) => {
      await page.locator('#main-panel').waitFor();
    });
  }
});

test('Notebook 7: the widget in the cell, the jobs panel on the left, Stop', async ({
  page,
  tmpPath
}) => {
  test.setTimeout(180000);
  const file = `${tmpPath}/nb7.ipynb`;
  await page.goto(`tree/${tmpPath}`); // Notebook 7's file browser, in the test's folder
  const content = notebookContent(['%load_ext jupyter_distrain', TRAIN]);
  expect(await page.contents.uploadContent(content, 'text', file)).toBe(true);
  await page.goto(`notebooks/${file}`);
  await expect(page.locator('.jp-NotebookPanel')).toBeVisible({ timeout: 60000 });
  await page.evaluate(async () => {
    const panel = (window as any).jupyterapp.shell.currentWidget;
    await panel.sessionContext.ready;
  });
  // not awaited: the job's cell runs until the panel's Stop
  await page.evaluate(() => {
    void (window as any).jupyterapp.commands.execute('notebook:run-all-cells');
  });

  const output = page.locator('.jp-Cell').nth(1).locator('.jp-OutputArea');
  const workers = output.locator('table tr', { has: page.locator('td', { hasText: /^worker$/ }) });
  await expect(workers).toHaveCount(2, { timeout: 90000 });
  await expect(workers.filter({ hasText: 'running' })).toHaveCount(2, { timeout: 30000 });
  const job = await jobNamed(page, 'nb7-job');

  // the panel as Notebook 7 opens a left-area panel (View > Left Sidebar, or its id)
  await page.evaluate(
    id => (window as any).jupyterapp.shell.activateById(id),
    'jp-distrain-sidebar'
  );
  const sidebar = page.locator('#jp-distrain-sidebar');
  await expect(sidebar).toBeVisible();
  const row = sidebar.locator(`li[data-job-id="${job.id}"]`);
  await expect(row).toHaveAttribute('data-state', 'running', { timeout: 30000 });
  await expect(row.locator('.jp-distrain-job-detail')).toHaveText('plain / local · workers 2/2');
  await expect(row.locator('.jp-distrain-job-images')).toContainText('img/s', { timeout: 30000 });
  await page.screenshot({ path: path.join(SHOTS, 'notebook7.png') });

  const pids = (await jobNamed(page, 'nb7-job')).processes
    .map(p => p.pid)
    .filter((pid): pid is number => !!pid);
  expect(pids).toHaveLength(2);
  await row.locator('button[data-action="stop"]').click();
  await page.locator('.jp-Dialog .jp-mod-accept').click();
  await expect(row).toHaveAttribute('data-state', 'stopped', { timeout: 60000 });
  await expect(workers.filter({ hasText: /stopped|killed|exited/ })).toHaveCount(2, {
    timeout: 30000
  });
  expect(pids.filter(alive)).toEqual([]);
  await expect.poll(() => processesMentioning(job.id), { timeout: 30000 }).toEqual([]);
});

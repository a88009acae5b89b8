/** A %%distributed cell shows the live widget: one row per worker, while it runs. */

import { expect } from '@jupyterlab/galata';
import * as path from 'path';

import { SERVER_USER, SHOTS, openNotebook, test } from './helpers';

const TRAIN = `%%distributed --workers 2 --backend plain --name ui-widget
import time
from jupyter_distrain import report
for step in range(1, 101):
    time.sleep(0.1)
    report(step=step, images=32, seconds=0.1, loss=1.0 / step)
`;

test('a %%distributed cell renders the live widget', async ({ page, tmpPath }) => {
  test.setTimeout(120000);
  const whoami = 'import getpass; print(getpass.getuser())';
  await openNotebook(page, tmpPath, 'widget.ipynb', ['%load_ext jupyter_distrain', TRAIN, whoami]);
  // the body under the magic's line is highlighted as Python
  const keyword = (await page.notebook.getCellLocator(1))!
    .locator('.cm-line span', { hasText: /^import$/ })
    .first();
  // the theme's keyword colour, resolved (JupyterLab 4.5 writes it '#008000', 4.6 'green')
  const keywordColour = await page.evaluate(() => {
    const probe = document.createElement('span');
    probe.style.color = 'var(--jp-mirror-editor-keyword-color)';
    document.body.appendChild(probe);
    const colour = getComputedStyle(probe).color;
    probe.remove();
    return colour;
  });
  expect(keywordColour).toBe('rgb(0, 128, 0)');
  await expect(keyword).toHaveCSS('color', keywordColour);

  await page.notebook.runCell(0, true);
  await page.notebook.selectCells(1);
  await page.keyboard.press('Control+Enter'); // run, without waiting for the end
  const output = (await page.notebook.getCellLocator(1))!.locator('.jp-OutputArea');
  const workers = output.locator('table tr', { has: page.locator('td', { hasText: /^worker$/ }) });
  await expect(workers).toHaveCount(2, { timeout: 60000 });
  await expect(workers.filter({ hasText: 'running' })).toHaveCount(2, { timeout: 30000 });
  await expect(output.locator('svg').first()).toBeVisible({ timeout: 30000 });
  await page.waitForTimeout(2000); // a few steps on the chart
  await output.screenshot({ path: path.join(SHOTS, 'widget.png') });
  await expect(workers.filter({ hasText: /succeeded|exited/ })).toHaveCount(2, {
    timeout: 60000
  });
  // the kernel (and so its job) runs as the server's ordinary account, never as root
  await page.notebook.runCell(2, true);
  expect((await page.notebook.getCellTextOutput(2))?.[0]?.trim()).toBe(SERVER_USER);
});

const LONGER = `%%distributed --workers 2 --backend plain --name ui-view
import time
from jupyter_distrain import report
for step in range(1, 151):
    time.sleep(0.1)
    report(step=step, images=32, seconds=0.1, total_steps=150)
`;

test('the widget is drawn once while its job runs (no display update re-creates it)', async ({
  page,
  tmpPath
}) => {
  // JupyterLab counts the view (_view_count), so the kernel keeps the display as it is
  // until the end; an update of the display would replace the widget's view (and its node)
  test.setTimeout(120000);
  await openNotebook(page, tmpPath, 'view.ipynb', ['%load_ext jupyter_distrain', LONGER]);
  await page.notebook.runCell(0, true);
  await page.notebook.selectCells(1);
  await page.keyboard.press('Control+Enter');
  const output = (await page.notebook.getCellLocator(1))!.locator('.jp-OutputArea');
  const workers = output.locator('table tr', { has: page.locator('td', { hasText: /^worker$/ }) });
  await expect(workers.filter({ hasText: 'running' })).toHaveCount(2, { timeout: 60000 });
  await output
    .locator('.widget-vbox')
    .first()
    .evaluate(node => node.setAttribute('data-first-view', 'yes'));
  // past the kernel's grace for counting views (2 s) and two of its text updates (3 s)
  await page.waitForTimeout(8000);
  await expect(workers.filter({ hasText: 'running' })).toHaveCount(2); // still running
  await expect(output.locator('.widget-vbox[data-first-view="yes"]')).toHaveCount(1);
  await expect(output.locator('.widget-vbox')).toHaveCount(1);
  await expect(workers.filter({ hasText: /succeeded|exited/ })).toHaveCount(2, {
    timeout: 60000
  });
});

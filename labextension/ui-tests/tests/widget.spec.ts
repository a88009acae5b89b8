/** A %%distributed cell shows the live widget: one row per worker, while it runs. */

import { expect, test } from '@jupyterlab/galata';
import * as path from 'path';

import { openNotebook, SHOTS } from './helpers';

const TRAIN = `%%distributed --workers 2 --backend plain --name ui-widget
import time
from jupyter_distrain import report
for step in range(1, 101):
    time.sleep(0.1)
    report(step=step, images=32, seconds=0.1, loss=1.0 / step)
`;

test('a %%distributed cell renders the live widget', async ({ page, tmpPath }) => {
  test.setTimeout(120000);
  await openNotebook(page, tmpPath, 'widget.ipynb', ['%load_ext jupyter_distrain', TRAIN]);
  // the body under the magic's line is highlighted as Python
  const keyword = (await page.notebook.getCellLocator(1))!
    .locator('.cm-line span', { hasText: /^import$/ })
    .first();
  const keywordColour = await page.evaluate(() =>
    getComputedStyle(document.body).getPropertyValue('--jp-mirror-editor-keyword-color').trim()
  );
  expect(keywordColour).toBe('#008000');
  await expect(keyword).toHaveCSS('color', 'rgb(0, 128, 0)');

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
});

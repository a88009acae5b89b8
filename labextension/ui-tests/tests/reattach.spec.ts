/**
 * The job a %%distributed cell started is kept in the cell's metadata; after a reload,
 * JupyterLab offers to reattach to it while it runs.
 */

import { expect } from '@jupyterlab/galata';

import { cellSource, distrainRoute, jobNamed, openNotebook, test } from './helpers';

const LOOP = `%%distributed --workers 2 --backend plain --grace 1 --name ui-reattach --background
import time
from jupyter_distrain import report
for step in range(1, 3000):
    time.sleep(0.1)
    report(step=step, images=32, seconds=0.1)
`;

test('a reloaded notebook offers to reattach to its running job', async ({ page, tmpPath }) => {
  test.setTimeout(120000);
  await openNotebook(page, tmpPath, 'reattach.ipynb', ['%load_ext jupyter_distrain', LOOP]);
  await page.notebook.runCell(0, true);
  await page.notebook.runCell(1, true);
  const job = await jobNamed(page, 'ui-reattach');
  const metadata = () =>
    page.evaluate(() => {
      const panel = (window as any).jupyterapp.shell.currentWidget;
      return panel.content.widgets[1].model.getMetadata('jupyter_distrain');
    });
  await expect.poll(metadata).toEqual({ job: job.id });
  await page.notebook.save();

  await page.evaluate(() => window.location.reload()); // a plain reload: JupyterLab restores
  const reattach = page.locator('.jp-toast-button', { hasText: 'Reattach' });
  await expect(reattach).toBeVisible({ timeout: 30000 });
  await expect(page.getByRole('alert')).toContainText(`Job ${job.id}, started by cell 2`);
  await reattach.click();
  expect(await cellSource(page, 2)).toBe(`%distributed attach ${job.id}`);

  const stopped = await page.request.delete(distrainRoute(`jobs/${job.id}`));
  expect(stopped.status()).toBe(202);
  await expect
    .poll(async () => (await jobNamed(page, 'ui-reattach')).state, { timeout: 30000 })
    .toBe('stopped');
});

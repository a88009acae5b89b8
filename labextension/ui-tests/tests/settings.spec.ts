/**
 * The extension's settings (schema/plugin.json): the poll interval an admin's
 * overrides.json sets (start-server.sh writes one) and the form's defaults a user sets.
 */

import { expect, galata } from '@jupyterlab/galata';

import { BASE_PATH, cellSource, openNotebook, test } from './helpers';

const PLUGIN = 'jupyter-distrain-labextension:plugin';

test('the sidebar polls at the interval overrides.json sets', async ({ page }) => {
  const settings = await page.request.get(`${BASE_PATH}lab/api/settings/${PLUGIN}`);
  expect(settings.ok()).toBe(true);
  const schema = (await settings.json()).schema;
  expect(schema.properties.pollInterval.default).toBe(1000); // overrides.json's, not 2000

  const polls: number[] = [];
  page.on('request', request => {
    if (new URL(request.url()).pathname === `${BASE_PATH}distrain/jobs`) {
      polls.push(Date.now());
    }
  });
  await page.waitForTimeout(6500);
  // a poll a second (the default would give 3 in 6.5 s)
  expect(polls.length).toBeGreaterThanOrEqual(5);
  const gaps = polls.slice(1).map((t, i) => t - polls[i]);
  expect(Math.min(...gaps)).toBeGreaterThan(700);
});

test.describe('with formDefaults set', () => {
  test.use({
    mockSettings: {
      ...galata.DEFAULT_SETTINGS,
      [PLUGIN]: { formDefaults: { workers: 2, launcher: 'ssh', hosts: 'a:1,b:1', 'no-pool': true } }
    }
  });

  test('a new line starts from them; an existing line keeps its own', async ({ page, tmpPath }) => {
    await openNotebook(page, tmpPath, 'defaults.ipynb', ['x = 1', '%%distributed -n 3\ny = 2']);
    const dialog = page.locator('.jp-Dialog');
    const form = dialog.locator('.jp-distrain-form');
    const open = async (index: number) => {
      await page.notebook.selectCells(index);
      await (await page.notebook.getCellLocator(index))!.click({ button: 'right' });
      await page.getByRole('menuitem', { name: 'Distribute cell...' }).click();
      await expect(form).toBeVisible();
    };

    await open(0);
    await expect(form.locator('input[name="workers"]')).toHaveValue('2');
    await expect(form.locator('select[name="launcher"]')).toHaveValue('ssh');
    await expect(form.locator('input[name="hosts"]')).toHaveValue('a:1,b:1');
    await expect(form.locator('input[name="no-pool"]')).toBeChecked();
    await dialog.locator('.jp-mod-accept').click();
    await expect(dialog).toHaveCount(0);
    // written once the server has checked the line: after the dialog closes
    await expect
      .poll(() => cellSource(page, 0))
      .toBe('%%distributed --workers 2 --launcher ssh --no-pool --hosts a:1,b:1\nx = 1');

    await open(1);
    await expect(form.locator('input[name="workers"]')).toHaveValue('3');
    await expect(form.locator('select[name="launcher"]')).toHaveValue('local');
    await expect(form.locator('input[name="hosts"]')).toHaveValue('');
    await dialog.locator('.jp-mod-reject').click();
  });
});

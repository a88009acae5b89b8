/**
 * "Distribute cell...": the form writes the %%distributed line of the active cell,
 * refuses what the magic would refuse with the magic's message (the server checks the
 * line), reads an existing line back into its fields, and shows the chosen launcher's
 * own options, as the server's flag table has them.
 */

import { expect } from '@jupyterlab/galata';
import * as path from 'path';

import { SHOTS, cellSource, openNotebook, test } from './helpers';

test('the form writes the magic line, refuses bad values and pre-fills', async ({
  page,
  tmpPath
}) => {
  await openNotebook(page, tmpPath, 'form.ipynb', ["print('hi')"]);
  const dialog = page.locator('.jp-Dialog');
  const form = dialog.locator('.jp-distrain-form');

  // from the cell's context menu
  await (await page.notebook.getCellLocator(0))!.click({ button: 'right' });
  await page.getByRole('menuitem', { name: 'Distribute cell...' }).click();
  await expect(form).toBeVisible();
  await form.locator('select[name="backend"]').selectOption('plain');
  await form.locator('input[name="workers"]').fill('0');
  const error = form.locator('.jp-distrain-form-error');
  await expect(error).toHaveText('--workers must be a whole number >= 1, got 0');
  await dialog.locator('.jp-mod-accept').click();
  // refused: asked again, with the message, and the cell unchanged
  await expect(error).toHaveText('--workers must be a whole number >= 1, got 0');
  expect(await cellSource(page, 0)).toBe("print('hi')");

  await form.locator('input[name="workers"]').fill('3');
  await form.locator('input[name="name"]').fill('train-1');
  await form.locator('textarea[name="env"]').fill('A=1\nB=2');
  await form.locator('input[name="no-pool"]').check();
  await expect(error).toHaveText('');
  await expect(form.locator('.jp-distrain-form-preview')).toHaveText(
    '%%distributed --workers 3 --backend plain --env A=1 --env B=2 --name train-1 --no-pool'
  );
  await dialog.screenshot({ path: path.join(SHOTS, 'distribute-form.png') });
  await dialog.locator('.jp-mod-accept').click();
  await expect(dialog).toHaveCount(0);
  // written once the server has checked the line: after the dialog closes
  await expect
    .poll(() => cellSource(page, 0))
    .toBe(
      "%%distributed --workers 3 --backend plain --env A=1 --env B=2 --name train-1 --no-pool\nprint('hi')"
    );

  // from the command palette: the line fills the form; a change rewrites only that line
  await page.notebook.selectCells(0);
  await page.keyboard.press('Control+Shift+C');
  await page.locator('.lm-CommandPalette input').fill('Distribute cell');
  await page.keyboard.press('Enter');
  await expect(form).toBeVisible();
  await expect(form.locator('input[name="workers"]')).toHaveValue('3');
  await expect(form.locator('select[name="backend"]')).toHaveValue('plain');
  await expect(form.locator('input[name="name"]')).toHaveValue('train-1');
  await expect(form.locator('textarea[name="env"]')).toHaveValue('A=1\nB=2');
  await expect(form.locator('input[name="no-pool"]')).toBeChecked();
  await form.locator('input[name="memory"]').fill('-1');
  await expect(form.locator('.jp-distrain-form-error')).toHaveText(
    '--memory must be a number of GiB > 0 and at most 65536, got -1.0'
  );
  await form.locator('input[name="memory"]').fill('1.5');
  // a launcher's options: shown for that launcher only, checked as it checks them
  const sshPort = form.locator('input[name="ssh-port"]');
  await expect(sshPort).toBeHidden();
  await form.locator('select[name="launcher"]').selectOption('ssh');
  await expect(sshPort).toBeVisible();
  await expect(form.locator('input[name="partition"]')).toBeHidden();
  await form.locator('input[name="hosts"]').fill('h1:2');
  await sshPort.fill('0');
  await expect(error).toHaveText('--ssh-port must be a port number 1-65535, got 0');
  await form.locator('select[name="launcher"]').selectOption('local');
  await expect(error).toHaveText('');
  await dialog.locator('.jp-mod-accept').click();
  // written once the server has checked the line: after the dialog closes
  await expect
    .poll(() => cellSource(page, 0))
    .toBe(
      "%%distributed --workers 3 --backend plain --memory 1.5 --env A=1 --env B=2 --name train-1 --no-pool\nprint('hi')"
    );

  // and from the toolbar of a cell (shown where it does not cover a long first line)
  await page.notebook.addCell('code', 'x = 1');
  const cell = (await page.notebook.getCellLocator(1))!;
  await cell.locator('[data-command="jupyter-distrain:distribute-cell"]').click();
  await expect(form.locator('input[name="workers"]')).toHaveValue('');
  await dialog.locator('.jp-mod-reject').click();
  await expect(dialog).toHaveCount(0);
  expect(await cellSource(page, 1)).toBe('x = 1');
});

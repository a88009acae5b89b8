/**
 * Through a real JupyterHub (tests/hubserver.py, the `hub` project's server): distrain-alice
 * logs in on the hub's login page, her server is spawned as her, a %%distributed cell of
 * a notebook of hers shows the live widget and her Distributed jobs sidebar lists the
 * job; distrain-bob, logged in beside her, sees no job of hers in his sidebar and gets
 * 403 from her server's routes.
 */

import { BrowserContext, Page, expect, test } from '@playwright/test';

const HUB = `http://127.0.0.1:${process.env.UI_TESTS_HUB_PORT || '8918'}/`;
const PASSWORD = process.env.UI_TESTS_HUB_PASSWORD || '';
const ALICE = 'distrain-alice';
const BOB = 'distrain-bob';

// a name of this run's own: her jobs root keeps the jobs of earlier runs
const NAME = `hub-ui-${Date.now().toString(36)}`;
const TRAIN = `%%distributed --workers 2 --backend plain --name ${NAME}
import time
from jupyter_distrain import report
for step in range(1, 301):
    time.sleep(0.1)
    report(step=step, images=32, seconds=0.1)
`;

/** Log ``user`` in on the hub's page; the page then shows their JupyterLab. */
async function logIn(context: BrowserContext, user: string): Promise<Page> {
  const page = await context.newPage();
  await page.goto(`${HUB}hub/login`);
  await page.locator('input[name="username"]').fill(user);
  await page.locator('input[name="password"]').fill(PASSWORD);
  await page.locator('input[type="submit"], button[type="submit"]').first().click();
  await page.waitForURL(new RegExp(`/user/${user}/lab`), { timeout: 90000 });
  await expect(page.locator('#jp-main-dock-panel')).toBeVisible({ timeout: 60000 });
  return page;
}

/** Write a notebook of ``cells`` into the user's server through its contents API, with
 * the session's cookie and XSRF token, as the browser's own requests are sent. */
async function writeNotebook(page: Page, user: string, name: string, cells: string[]) {
  const cookies = await page.context().cookies(`${HUB}user/${user}/`);
  const xsrf = cookies.find(c => c.name === '_xsrf')?.value || '';
  const content = {
    cells: cells.map(source => ({
      cell_type: 'code',
      source,
      metadata: {},
      outputs: [],
      execution_count: null
    })),
    metadata: { kernelspec: { name: 'python3', display_name: 'Python 3', language: 'python' } },
    nbformat: 4,
    nbformat_minor: 5
  };
  const answer = await page.request.put(`${HUB}user/${user}/api/contents/${name}`, {
    data: { type: 'notebook', format: 'json', content },
    headers: { 'X-XSRFToken': xsrf }
  });
  expect(answer.status()).toBeLessThan(300);
}

test('a cell through the hub: her widget and sidebar, nothing for her neighbour', async ({
  browser
}) => {
  test.setTimeout(300000);
  expect(PASSWORD).not.toBe('');
  const hers = await browser.newContext();
  const page = await logIn(hers, ALICE);
  await writeNotebook(page, ALICE, 'hub-ui.ipynb', ['%load_ext jupyter_distrain', TRAIN]);
  await page.goto(`${HUB}user/${ALICE}/lab/tree/hub-ui.ipynb`);
  const cells = page.locator('.jp-Notebook .jp-Cell');
  await expect(cells).toHaveCount(2, { timeout: 60000 });
  await expect(page.locator('.jp-Notebook-ExecutionIndicator[data-status="idle"]')).toHaveCount(1, {
    timeout: 60000
  });
  await cells.first().click();
  await page.keyboard.press('Shift+Enter'); // %load_ext
  await page.keyboard.press('Shift+Enter'); // the %%distributed cell

  const output = cells.nth(1).locator('.jp-OutputArea');
  const workers = output.locator('table tr', { has: page.locator('td', { hasText: /^worker$/ }) });
  await expect(workers.filter({ hasText: 'running' })).toHaveCount(2, { timeout: 90000 });

  const sidebar = page.locator('#jp-distrain-sidebar');
  await page.locator('.jp-distrain-status').click();
  await expect(sidebar).toBeVisible();
  const row = sidebar.locator('li[data-job-id]', { hasText: NAME });
  await expect(row).toHaveAttribute('data-state', 'running', { timeout: 60000 });
  const jobId = await row.getAttribute('data-job-id');

  // her neighbour, logged in beside her: his sidebar has no job, her routes refuse him
  const his = await browser.newContext();
  const bobPage = await logIn(his, BOB);
  await bobPage.locator('.jp-distrain-status').click();
  const bobSidebar = bobPage.locator('#jp-distrain-sidebar');
  await expect(bobSidebar).toBeVisible();
  await expect(bobSidebar).toContainText('No jobs yet');
  await expect(bobSidebar.locator('li[data-job-id]')).toHaveCount(0);
  for (const path of ['distrain/jobs', `distrain/jobs/${jobId}`]) {
    // her server sends him to the hub to authorize, and the hub refuses him
    const answer = await bobPage.request.get(`${HUB}user/${ALICE}/${path}`);
    expect(answer.status()).toBe(403);
  }
  expect((await page.request.get(`${HUB}user/${ALICE}/distrain/jobs`)).status()).toBe(200);

  await expect(workers.filter({ hasText: /succeeded|exited/ })).toHaveCount(2, {
    timeout: 90000
  });
  await his.close();
  await hers.close();
});

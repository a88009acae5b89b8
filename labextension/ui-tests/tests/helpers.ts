/** Shared steps of the UI tests: notebooks written through the contents API, the
 * job store read through the extension's REST API, processes checked on this machine. */

import { IJupyterLabPageFixture, test as galataTest } from '@jupyterlab/galata';
import { expect, Page } from '@playwright/test';
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';

export const SHOTS = path.join(__dirname, '..', 'test-results');

/** The server's base URL path, as a hub gives a user's server (playwright.config.js). */
export const BASE_PATH = process.env.UI_TESTS_BASE_PATH || '/user/alice/';

/**
 * Whom the server, its kernels and their jobs run as: the ordinary account start-server.sh
 * runs them as when the tests are started by root, else the account running the tests.
 */
export const SERVER_USER =
  process.getuid?.() === 0 ? process.env.UI_TESTS_USER || 'distrain-alice' : os.userInfo().username;

/** The extension's REST route `path` (e.g. `jobs`) under the server's base URL. */
export function distrainRoute(path: string): string {
  return `${BASE_PATH}distrain/${path}`;
}

/**
 * Galata's fixtures, with the test's folder made under the server's base URL: Galata's
 * own `tmpPath` asks the server's root (`/api/contents`) when a hub's base URL is set.
 * The server deletes a folder with its files (always_delete_dir).
 */
export const test = galataTest.extend({
  tmpPath: async ({ request }, use, testInfo) => {
    const folder = path.basename(testInfo.outputDir).replace(/-retry\d+$/i, '');
    const url = `${BASE_PATH}api/contents/${folder}`;
    await request.delete(url);
    const made = await request.put(url, { data: { type: 'directory' } });
    expect(made.status()).toBe(201);
    await use(folder);
    await request.delete(url);
  }
});

/** A Python 3 notebook of these code cells (not run), as its file's text. */
export function notebookContent(cells: string[]): string {
  const notebook = {
    cells: cells.map(source => ({
      cell_type: 'code',
      execution_count: null,
      metadata: {},
      outputs: [],
      source
    })),
    metadata: {
      kernelspec: { display_name: 'Python 3 (ipykernel)', language: 'python', name: 'python3' }
    },
    nbformat: 4,
    nbformat_minor: 5
  };
  return JSON.stringify(notebook);
}

/** A notebook in `dir` with these code cells, opened; the cells are not run. */
export async function openNotebook(
  page: IJupyterLabPageFixture,
  dir: string,
  name: string,
  cells: string[]
): Promise<void> {
  const file = `${dir}/${name}`;
  expect(await page.contents.uploadContent(notebookContent(cells), 'text', file)).toBe(true);
  expect(await page.notebook.openByPath(file)).toBe(true);
  await page.notebook.activate(name);
  await page.waitForSelector('.jp-Notebook-ExecutionIndicator[data-status="idle"]', {
    timeout: 60000
  });
}

export interface IProcessModel {
  id: string;
  pid: number | null;
  state: string;
}

export interface IJobModel {
  id: string;
  state: string;
  workers: number;
  workers_up: number;
  processes: IProcessModel[];
}

export async function listJobs(page: Page): Promise<IJobModel[]> {
  const response = await page.request.get(distrainRoute('jobs'));
  expect(response.ok()).toBe(true);
  return (await response.json()).jobs;
}

/** The newest job whose id starts with `name` (the job's --name), once it is listed,
 * with its processes (the list leaves them out: `GET jobs/<id>` has them). */
export async function jobNamed(page: Page, name: string, timeout = 60000): Promise<IJobModel> {
  let found: IJobModel | undefined;
  await expect
    .poll(async () => (found = (await listJobs(page)).find(j => j.id.startsWith(name))), {
      timeout
    })
    .toBeTruthy();
  const response = await page.request.get(distrainRoute(`jobs/${found!.id}`));
  expect(response.ok()).toBe(true);
  return await response.json();
}

/** Whether a process with this pid exists on this machine. */
export function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/** The source of the current notebook's cell `index`, read from its model. */
export async function cellSource(page: Page, index: number): Promise<string> {
  return page.evaluate(i => {
    const panel = (window as any).jupyterapp.shell.currentWidget;
    return panel.content.widgets[i].model.sharedModel.getSource() as string;
  }, index);
}

/** The pids of this machine's processes whose command line mentions `text`. */
export function processesMentioning(text: string): number[] {
  const pids: number[] = [];
  for (const entry of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(entry) || Number(entry) === process.pid) {
      continue;
    }
    try {
      if (fs.readFileSync(`/proc/${entry}/cmdline`, 'utf8').includes(text)) {
        pids.push(Number(entry));
      }
    } catch {
      // gone meanwhile
    }
  }
  return pids;
}

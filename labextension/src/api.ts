/** The server extension's REST API under `<base_url>/distrain/` (jupyter_distrain/server). */

import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import { IFlagTable } from './magicline';

export interface IProcess {
  id: string;
  role: string;
  index: number;
  state: string;
  pid: number | null;
  step: number | null;
  images_per_sec: number | null;
}

export interface IJob {
  id: string;
  name: string;
  state: string;
  backend: string;
  launcher: string;
  workers: number;
  workers_up: number;
  ps: number;
  scaling_to: number | null;
  restarts?: number; // after failures (--max-restarts)
  max_restarts?: number;
  images_per_sec: number;
  created: number | null;
  ended: number | null;
  error: string | null;
  session?: string | null; // an interactive session's name (%%distributed --session NAME)
  processes?: IProcess[]; // in a job's own model (GET jobs/<id>), not in the list
}

export interface ILogs {
  process: string;
  processes: string[];
  lines: string[];
  offset: number;
}

export const FINAL_STATES = ['succeeded', 'exited', 'stopped', 'killed', 'failed'];

/** A request to the API; a failure is an Error with the server's one-line message. */
export async function requestAPI<T>(
  path: string,
  init: RequestInit = {},
  query: Record<string, string | number> = {}
): Promise<T> {
  const settings = ServerConnection.makeSettings();
  const search = Object.entries(query)
    .map(([k, v]) => `${encodeURIComponent(k)}=${encodeURIComponent(String(v))}`)
    .join('&');
  const url = URLExt.join(settings.baseUrl, 'distrain', path) + (search ? `?${search}` : '');
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(url, init, settings);
  } catch (error) {
    throw new ServerConnection.NetworkError(error as TypeError);
  }
  const text = await response.text();
  let data: any = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = null;
  }
  if (!response.ok) {
    const message = data?.message || `${response.status} ${response.statusText}`;
    throw new Error(String(message).split('\n')[0]);
  }
  return data as T;
}

export const listJobs = () => requestAPI<{ jobs: IJob[] }>('jobs').then(r => r.jobs);

export const scaleJob = (id: string, workers: number) =>
  requestAPI<IJob>(`jobs/${encodeURIComponent(id)}`, {
    method: 'PATCH',
    body: JSON.stringify({ workers })
  });

export const stopJob = (id: string) =>
  requestAPI<IJob>(`jobs/${encodeURIComponent(id)}`, { method: 'DELETE' });

/** Remove the finished jobs (never a running one); answers the ids removed. */
export const removeFinishedJobs = () =>
  requestAPI<{ removed: string[] }>('jobs', { method: 'DELETE' }).then(r => r.removed);

export const getLogs = (id: string, query: Record<string, string | number>) =>
  requestAPI<ILogs>(`jobs/${encodeURIComponent(id)}/logs`, {}, query);

/** The `%%distributed` flags, as the magic's flag table has them (the form's fields). */
/** Every live process's stacks, grouped (an ended job: the last ones taken). */
export interface IStacks {
  job: string;
  reason: string;
  taken: number;
  kept: boolean;
  groups: { names: string[]; headline: string }[];
  odd_ones_out: string[];
  text: string;
}

/** Take them now (POST: each process is signalled; a GET reads the last ones kept). */
export const takeStacks = (id: string) =>
  requestAPI<IStacks>(`jobs/${encodeURIComponent(id)}/stacks`, {
    method: 'POST',
    body: JSON.stringify({ native: false })
  });

export const getFlags = () => requestAPI<IFlagTable>('flags');

/** What the magic would refuse these flags (the words after `%%distributed`) with; null
 * when it would take them. Nothing is submitted. */
export const checkLine = (line: string) =>
  requestAPI<{ error: string | null }>('flags/check', {
    method: 'POST',
    body: JSON.stringify({ line })
  }).then(r => r.error);

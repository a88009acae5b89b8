import { Signal } from '@lumino/signaling';
import { Widget } from '@lumino/widgets';

import { IJob } from '../api';
import { JobsModel } from '../model';
import { IJobActions, JobsSidebar } from '../sidebar';

/** The sidebar's view of a model: its jobs, and a signal when they change. */
class ListedJobs {
  constructor(public jobs: IJob[] = []) {}
  readonly changed = new Signal<this, void>(this);
  error = '';
  get finished(): IJob[] {
    return this.jobs.filter(j => j.state !== 'running');
  }
  series(): number[] {
    return [];
  }
}

function job(id: string, state: string): IJob {
  return {
    id,
    name: '',
    state,
    backend: 'plain',
    launcher: 'local',
    workers: 2,
    workers_up: state === 'running' ? 2 : 0,
    ps: 0,
    scaling_to: null,
    images_per_sec: 0,
    created: 1,
    ended: state === 'running' ? null : 2,
    error: null,
    processes: []
  };
}

describe('JobsSidebar', () => {
  it('offers to remove the finished jobs only while there is one', () => {
    const model = new ListedJobs([job('a', 'running')]);
    let removals = 0;
    const actions: IJobActions = {
      scale: () => undefined,
      stop: () => undefined,
      logs: () => undefined,
      stacks: () => undefined,
      attach: () => undefined,
      removeFinished: () => void removals++
    };
    const sidebar = new JobsSidebar(model as unknown as JobsModel, actions);
    Widget.attach(sidebar, document.body);
    const button = sidebar.node.querySelector<HTMLButtonElement>(
      'button[data-action="remove-finished"]'
    )!;
    expect(button.title).toBe('Remove finished jobs');
    expect(button.disabled).toBe(true);

    model.jobs = [job('a', 'running'), job('b', 'succeeded')];
    model.changed.emit();
    expect(button.disabled).toBe(false);
    button.click();
    expect(removals).toBe(1);

    model.jobs = [job('a', 'running')];
    model.changed.emit();
    expect(button.disabled).toBe(true);
    expect([...sidebar.node.querySelectorAll('li')].map(li => li.dataset.jobId)).toEqual(['a']);

    model.jobs = [{ ...job('a', 'running'), restarts: 1, max_restarts: 3 }];
    model.changed.emit();
    expect(sidebar.node.querySelector('.jp-distrain-job-detail')!.textContent).toBe(
      'plain / local · workers 2/2 · restart 1 of 3'
    );

    model.jobs = [{ ...job('a', 'running'), session: 'digits' }];
    model.changed.emit();
    expect(sidebar.node.querySelector('.jp-distrain-job-name')!.textContent).toBe(
      'session digits (a)'
    );
    const scale = sidebar.node.querySelector<HTMLButtonElement>('button[data-action="scale"]')!;
    expect(scale.disabled).toBe(true);
    sidebar.dispose();
  });
});

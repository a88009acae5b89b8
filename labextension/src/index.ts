/**
 * jupyter_distrain in JupyterLab: the "Distributed jobs" sidebar, its status bar item,
 * the job logs panel and the "Distribute cell..." command.
 */

import { ILayoutRestorer, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICommandPalette, showErrorMessage } from '@jupyterlab/apputils';
import { CodeCell } from '@jupyterlab/cells';
import { INotebookTracker } from '@jupyterlab/notebook';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { IStatusBar } from '@jupyterlab/statusbar';
import { deleteIcon, LabIcon } from '@jupyterlab/ui-components';

import { attach, removeFinished, scale, stacks, stop } from './actions';
import { distributeCell } from './distribute';
import { getFlags } from './api';
import { DefaultValue, emptyLine, IMagicLine, lineFromDefaults, setFlagTable } from './magicline';
import { logsPanel } from './logs';
import { trackJobs } from './reattach';
import { JobsModel, POLL_MS } from './model';
import { JobsSidebar, REMOVE_FINISHED_LABEL } from './sidebar';
import { JobsStatus } from './statusbar';

const SIDEBAR_ID = 'jp-distrain-sidebar';
const DISTRIBUTE_COMMAND = 'jupyter-distrain:distribute-cell';
const REMOVE_FINISHED_COMMAND = 'jupyter-distrain:remove-finished-jobs';

const icon = new LabIcon({
  name: 'jupyter-distrain:jobs',
  svgstr:
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24"><g class="jp-icon3" fill="#616161">' +
    '<circle cx="12" cy="5" r="3"/><circle cx="5" cy="18" r="3"/><circle cx="19" cy="18" r="3"/>' +
    '<path d="M11 8h2v3l5 4-1 1.6-5-4-5 4L6 15l5-4z"/></g></svg>'
});

const PLUGIN_ID = 'jupyter-distrain-labextension:plugin';

/**
 * Follow the extension's settings (schema/plugin.json; overrides.json sets them for a
 * whole server): the poll interval of `model`, and the form's defaults through `setForm`
 * (read with the flag table, once `flags` has come).
 */
function followSettings(
  registry: ISettingRegistry,
  model: JobsModel,
  flags: Promise<void>,
  setForm: (line: IMagicLine) => void
): void {
  const apply = async (settings: ISettingRegistry.ISettings) => {
    model.interval = (settings.composite.pollInterval as number) ?? POLL_MS;
    try {
      await flags;
    } catch {
      return; // said once where the flags are fetched
    }
    const defaults = (settings.composite.formDefaults ?? {}) as { [name: string]: DefaultValue };
    const { line, unknown } = lineFromDefaults(defaults);
    if (unknown.length) {
      console.warn(`jupyter-distrain: formDefaults names no flag of the magic: ${unknown}`);
    }
    setForm(line);
  };
  registry
    .load(PLUGIN_ID)
    .then(settings => {
      void apply(settings);
      settings.changed.connect(() => void apply(settings));
    })
    .catch(reason => console.warn(`jupyter-distrain: settings not read: ${reason}`));
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description: 'Distributed jobs: a sidebar, a status bar item and a Distribute cell... form',
  autoStart: true,
  requires: [INotebookTracker],
  optional: [ICommandPalette, ILayoutRestorer, IStatusBar, ISettingRegistry],
  activate: (
    app: JupyterFrontEnd,
    tracker: INotebookTracker,
    palette: ICommandPalette | null,
    restorer: ILayoutRestorer | null,
    statusBar: IStatusBar | null,
    settingRegistry: ISettingRegistry | null
  ) => {
    const model = new JobsModel();
    // the magic's flags, from the server (the form has no list of its own)
    const flags = getFlags().then(setFlagTable);
    flags.catch(reason => console.warn(`jupyter-distrain: the flags not read: ${reason}`));
    let formDefaults = emptyLine();
    if (settingRegistry) {
      followSettings(settingRegistry, model, flags, line => (formDefaults = line));
    }
    const after = (done: Promise<boolean>) =>
      void done.then(changed => (changed ? model.refresh() : undefined));
    const sidebar = new JobsSidebar(
      model,
      {
        scale: job => after(scale(job)),
        stop: job => after(stop(job)),
        stacks: job => void stacks(job),
        attach: job => void attach(job, tracker),
        removeFinished: () => void app.commands.execute(REMOVE_FINISHED_COMMAND),
        logs: job => {
          const id = `jp-distrain-logs-${job.id}`;
          const open = [...app.shell.widgets('main')].find(w => w.id === id);
          if (!open) {
            app.shell.add(logsPanel(job.id), 'main');
          }
          app.shell.activateById(id);
        }
      },
      deleteIcon
    );
    sidebar.id = SIDEBAR_ID;
    sidebar.title.icon = icon;
    sidebar.title.caption = 'Distributed jobs';
    app.shell.add(sidebar, 'left', { rank: 200 });
    restorer?.add(sidebar, SIDEBAR_ID);

    if (statusBar) {
      statusBar.registerStatusItem('jupyter-distrain:status', {
        item: new JobsStatus(model, () => app.shell.activateById(SIDEBAR_ID)),
        align: 'left',
        rank: 4
      });
    }

    trackJobs(tracker);

    app.commands.addCommand(REMOVE_FINISHED_COMMAND, {
      label: REMOVE_FINISHED_LABEL,
      caption: 'Delete the records, logs and metrics of every finished job',
      icon: deleteIcon,
      isEnabled: () => model.finished.length > 0,
      execute: () => after(removeFinished(model.finished))
    });
    model.changed.connect(() => app.commands.notifyCommandChanged(REMOVE_FINISHED_COMMAND));
    palette?.addItem({ command: REMOVE_FINISHED_COMMAND, category: 'Distributed jobs' });

    const activeCodeCell = () => {
      const cell = tracker.activeCell;
      return cell instanceof CodeCell && tracker.currentWidget === app.shell.currentWidget
        ? cell
        : null;
    };
    app.commands.addCommand(DISTRIBUTE_COMMAND, {
      label: 'Distribute cell...',
      caption: 'Run this code cell on many workers: write its %%distributed line',
      icon,
      isEnabled: () => activeCodeCell() !== null,
      execute: async () => {
        const cell = activeCodeCell();
        if (!cell) {
          return false;
        }
        try {
          await flags;
        } catch (reason) {
          await showErrorMessage('Distribute cell', `The server did not send the flags: ${reason}`);
          return false;
        }
        return distributeCell(cell, formDefaults);
      }
    });
    palette?.addItem({ command: DISTRIBUTE_COMMAND, category: 'Notebook Cell Operations' });
    app.contextMenu.addItem({
      command: DISTRIBUTE_COMMAND,
      selector: '.jp-Notebook .jp-CodeCell',
      rank: 20
    });
  }
};

export default plugin;

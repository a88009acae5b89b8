/**
 * "Distribute cell...": a form for the `%%distributed` flags that writes (or updates)
 * the first line of the active code cell. An existing line fills the form; the server
 * checks the line as the magic does, and a value the magic would refuse is refused here
 * with the magic's message. The chosen launcher's own options (from the flag table the
 * server sends) get fields of their own.
 */

import { Dialog, showDialog } from '@jupyterlab/apputils';
import { Cell } from '@jupyterlab/cells';
import { Widget } from '@lumino/widgets';

import { checkLine } from './api';
import {
  CELL_MAGIC,
  emptyLine,
  flagTable,
  formatLine,
  hasMagic,
  IFlag,
  IMagicLine,
  parseLine,
  withMagicLine
} from './magicline';

type FieldKind = 'text' | 'number' | 'select' | 'check' | 'lines';

interface IField {
  flag: string;
  label: string;
  kind: FieldKind;
  placeholder?: string;
  /** A launcher option's field: the launchers it is shown for. */
  launchers?: string[];
}

/** The job's own flags the form shows, in its order (a select's values: the table's). */
const JOB_FIELDS: IField[] = [
  { flag: 'backend', label: 'Backend', kind: 'select' },
  { flag: 'workers', label: 'Workers', kind: 'number', placeholder: '1' },
  { flag: 'ps', label: 'Parameter servers', kind: 'number', placeholder: '0' },
  { flag: 'launcher', label: 'Launcher', kind: 'select' },
  { flag: 'controller', label: 'Horovod controller', kind: 'select' },
  { flag: 'cpu', label: 'CPU cores per worker', kind: 'text', placeholder: 'any' },
  { flag: 'memory', label: 'Memory per worker (GiB)', kind: 'text', placeholder: 'any' },
  { flag: 'gpus', label: 'GPUs per worker', kind: 'number', placeholder: '0' },
  { flag: 'name', label: 'Name', kind: 'text', placeholder: 'job' },
  { flag: 'timeout', label: 'Start timeout (s)', kind: 'text', placeholder: '120' },
  { flag: 'env', label: 'Environment (KEY=VALUE, one a line)', kind: 'lines' },
  { flag: 'push', label: 'Push variables', kind: 'text', placeholder: 'a,b' },
  { flag: 'out', label: 'Result variable', kind: 'text', placeholder: 'history' },
  { flag: 'keras', label: 'Keras', kind: 'select' },
  { flag: 'background', label: 'Run in the background', kind: 'check' },
  { flag: 'no-pool', label: 'Start cold (no warm pool)', kind: 'check' }
];

/** A launcher option's field, as its launcher declares it (its help is the label). */
function optionField(flag: IFlag): IField {
  const kind: FieldKind = flag.kind === 'bool' ? 'check' : flag.kind === 'int' ? 'number' : 'text';
  return {
    flag: flag.name,
    label: flag.help,
    kind,
    placeholder: flag.default,
    launchers: flag.launchers
  };
}

/** The values a select offers: the backends and launchers the server has, else the
 * flag's choices. */
function choicesOf(name: string): string[] {
  const table = flagTable();
  if (name === 'backend') {
    return table.backends;
  }
  if (name === 'launcher') {
    return table.launchers;
  }
  return table.flags.find(f => f.name === name)?.choices ?? [];
}

/** The words after the magic's name: what the server checks. */
function argumentsOf(line: IMagicLine): string {
  return formatLine(line).slice(CELL_MAGIC.length).trim();
}

/** The magic's message for `line`, or null when it would take it; a failed request is
 * a message too (nothing is written unchecked). */
export async function lineError(line: IMagicLine): Promise<string | null> {
  try {
    return await checkLine(argumentsOf(line));
  } catch (error) {
    return `cannot check the flags: ${(error as Error).message}`;
  }
}

type Input = HTMLInputElement | HTMLSelectElement | HTMLTextAreaElement;

/** The form's body: one input per field; the flags it has no field for are kept. */
export class DistributeForm extends Widget {
  constructor(
    private _initial: IMagicLine,
    error: string | null = null
  ) {
    super();
    this.addClass('jp-distrain-form');
    const options = flagTable().flags.filter(f => f.option);
    this._fields = [...JOB_FIELDS, ...options.map(optionField)];
    const grid = document.createElement('div');
    grid.className = 'jp-distrain-form-grid';
    for (const field of this._fields) {
      const input = this._input(field, _initial.values[field.flag]);
      input.name = field.flag;
      input.addEventListener('input', () => this._changed());
      input.addEventListener('change', () => this._changed());
      const label = document.createElement('label');
      label.textContent = field.label;
      label.className = `jp-distrain-form-label jp-distrain-field-${field.kind}`;
      label.appendChild(input);
      grid.appendChild(label);
      this._inputs.set(field.flag, input);
      this._labels.set(field.flag, label);
    }
    this._error.className = 'jp-distrain-form-error';
    this._preview.className = 'jp-distrain-form-preview';
    this.node.append(grid, this._preview, this._error);
    this._changed();
    if (error) {
      this._error.textContent = error;
    }
  }

  /** The line the form gives: its fields over the initial line's other flags; the
   * options of launchers other than the chosen one left out. */
  getValue(): IMagicLine {
    const line: IMagicLine = {
      values: { ...this._initial.values },
      extra: [...this._initial.extra]
    };
    const launcher = this._inputs.get('launcher')!.value;
    for (const field of this._fields) {
      const input = this._inputs.get(field.flag)!;
      if (field.launchers && !field.launchers.includes(launcher)) {
        delete line.values[field.flag];
      } else if (field.kind === 'check') {
        line.values[field.flag] = (input as HTMLInputElement).checked;
      } else if (field.kind === 'lines') {
        line.values[field.flag] = input.value
          .split('\n')
          .map(l => l.trim())
          .filter(l => l);
      } else {
        line.values[field.flag] = input.value.trim();
      }
    }
    // as written and read back: a value with a space is what the magic would get
    return parseLine(formatLine(line));
  }

  private _changed(): void {
    const launcher = this._inputs.get('launcher')!.value;
    for (const field of this._fields) {
      const shown = !field.launchers || field.launchers.includes(launcher);
      this._labels.get(field.flag)!.hidden = !shown;
    }
    const line = this.getValue();
    this._preview.textContent = formatLine(line);
    const asked = ++this._asked;
    void lineError(line).then(error => {
      if (asked === this._asked) {
        this._error.textContent = error ?? ''; // the latest line's answer only
      }
    });
  }

  private _input(field: IField, value: string | boolean | string[] | undefined): Input {
    if (field.kind === 'select') {
      const select = document.createElement('select');
      const options = [...choicesOf(field.flag)];
      if (typeof value === 'string' && value && !options.includes(value)) {
        options.push(value);
      }
      options.forEach(o => select.appendChild(new Option(o, o)));
      select.value = typeof value === 'string' && value ? value : options[0];
      return select;
    }
    if (field.kind === 'lines') {
      const area = document.createElement('textarea');
      area.rows = 2;
      area.value = Array.isArray(value) ? value.join('\n') : '';
      return area;
    }
    const input = document.createElement('input');
    if (field.kind === 'check') {
      input.type = 'checkbox';
      input.checked = value === true;
      return input;
    }
    input.type = 'text';
    input.inputMode = field.kind === 'number' ? 'numeric' : 'text';
    input.placeholder = field.placeholder ?? '';
    input.value = typeof value === 'string' ? value : '';
    return input;
  }

  private _asked = 0;
  private _error = document.createElement('div');
  private _fields: IField[];
  private _inputs = new Map<string, Input>();
  private _labels = new Map<string, HTMLLabelElement>();
  private _preview = document.createElement('code');
}

/**
 * Ask for the flags of `cell` (a code cell) and write its `%%distributed` line; asked
 * again, with the message, while the magic would refuse them. A cell with no line yet
 * starts from `defaults` (the `formDefaults` setting). Resolves whether written.
 */
export async function distributeCell(
  cell: Cell,
  defaults: IMagicLine = emptyLine()
): Promise<boolean> {
  const source = cell.model.sharedModel.getSource();
  let line = hasMagic(source) ? parseLine(source.split('\n', 1)[0]) : defaults;
  let error: string | null = null;
  for (;;) {
    const answer = await showDialog({
      title: 'Distribute cell',
      body: new DistributeForm(line, error),
      buttons: [Dialog.cancelButton(), Dialog.okButton({ label: 'Write %%distributed' })],
      focusNodeSelector: 'input[name="workers"]'
    });
    if (!answer.button.accept || !answer.value) {
      return false;
    }
    line = answer.value;
    error = await lineError(line);
    if (error === null) {
      const current = cell.model.sharedModel.getSource();
      cell.model.sharedModel.setSource(withMagicLine(current, formatLine(line)));
      return true;
    }
  }
}

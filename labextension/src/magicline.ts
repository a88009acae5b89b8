/**
 * The `%%distributed` first line of a cell: parse it into flag values, write it back
 * from them, and check the values as the magic does (the same one-line messages as
 * argparse and `JobSpec.validate` in jupyter_distrain/spec.py).
 */

export const CELL_MAGIC = '%%distributed';

export type FlagKind = 'int' | 'float' | 'str' | 'bool' | 'repeat';

export interface IFlag {
  /** The long name without dashes, e.g. `workers`. */
  name: string;
  kind: FlagKind;
  /** The default as the magic has it ('' for none); the line leaves defaults out. */
  default: string;
  short?: string;
}

/** The magic's flags (jupyter_distrain/magics.py), in the order a written line has them. */
export const FLAGS: IFlag[] = [
  { name: 'workers', kind: 'int', default: '1', short: 'n' },
  { name: 'ps', kind: 'int', default: '0' },
  { name: 'backend', kind: 'str', default: 'auto' },
  { name: 'launcher', kind: 'str', default: 'local' },
  { name: 'controller', kind: 'str', default: 'gloo' },
  { name: 'cpu', kind: 'float', default: '' },
  { name: 'memory', kind: 'float', default: '' },
  { name: 'gpus', kind: 'int', default: '0' },
  { name: 'gpu-ids', kind: 'str', default: '' },
  { name: 'env', kind: 'repeat', default: '' },
  { name: 'name', kind: 'str', default: 'job' },
  { name: 'timeout', kind: 'float', default: '120' },
  { name: 'grace', kind: 'float', default: '5' },
  { name: 'push', kind: 'str', default: '' },
  { name: 'out', kind: 'str', default: '' },
  { name: 'hang-timeout', kind: 'float', default: '120' },
  { name: 'stall-timeout', kind: 'float', default: '60' },
  { name: 'keras', kind: 'str', default: 'auto' },
  { name: 'batch-size', kind: 'int', default: '' },
  { name: 'all-output', kind: 'bool', default: '' },
  { name: 'no-pool', kind: 'bool', default: '' },
  { name: 'hosts', kind: 'str', default: '' },
  { name: 'ssh-port', kind: 'int', default: '22' },
  { name: 'ssh-user', kind: 'str', default: '' },
  { name: 'ssh-identity', kind: 'str', default: '' },
  { name: 'ssh-known-hosts', kind: 'str', default: '' },
  { name: 'ssh-accept-new-hosts', kind: 'bool', default: '' },
  { name: 'remote-python', kind: 'str', default: '' },
  { name: 'network-interface', kind: 'str', default: '' },
  { name: 'address', kind: 'str', default: '' },
  { name: 'partition', kind: 'str', default: '' },
  { name: 'time', kind: 'str', default: '' },
  { name: 'account', kind: 'str', default: '' },
  { name: 'qos', kind: 'str', default: '' },
  { name: 'nodes', kind: 'int', default: '0' },
  { name: 'sbatch-options', kind: 'str', default: '' },
  { name: 'queue-timeout', kind: 'float', default: '0' },
  { name: 'background', kind: 'bool', default: '' }
];

const BY_NAME = new Map(FLAGS.map(f => [f.name, f]));
const BY_SHORT = new Map(FLAGS.filter(f => f.short).map(f => [f.short!, f]));

/**
 * A line's flags as written (text; `true` for a switch; a list for `--env`), and the
 * words it has that are no flag of the magic (kept as they are when written back).
 */
export interface IMagicLine {
  values: { [name: string]: string | boolean | string[] };
  extra: string[];
}

export function emptyLine(): IMagicLine {
  return { values: {}, extra: [] };
}

/** A setting's value of a flag: text, a number, a switch, or lines (`--env`). */
export type DefaultValue = string | number | boolean | string[];

/**
 * A new line from the form's defaults (the `formDefaults` setting, by flag name): each
 * value as the line would hold it; the names that are no flag of the magic, returned
 * apart so that they can be reported, are left out.
 */
export function lineFromDefaults(defaults: { [name: string]: DefaultValue }): {
  line: IMagicLine;
  unknown: string[];
} {
  const line = emptyLine();
  const unknown: string[] = [];
  for (const [name, value] of Object.entries(defaults)) {
    const flag = BY_NAME.get(name.replace(/^-+/, ''));
    if (!flag) {
      unknown.push(name);
    } else if (flag.kind === 'bool') {
      line.values[flag.name] = value === true || value === 'true';
    } else if (flag.kind === 'repeat') {
      const lines = Array.isArray(value) ? value : String(value).split('\n');
      line.values[flag.name] = lines.map(l => l.trim()).filter(l => l);
    } else {
      line.values[flag.name] = Array.isArray(value) ? value.join(',') : String(value);
    }
  }
  return { line, unknown };
}

/** Whether `source` starts with the cell magic (not a longer magic name, not `?`). */
export function hasMagic(source: string): boolean {
  const first = source.split('\n', 1)[0];
  if (!first.startsWith(CELL_MAGIC)) {
    return false;
  }
  const rest = first.slice(CELL_MAGIC.length);
  return (rest === '' || /^\s/.test(rest)) && !first.trimEnd().endsWith('?');
}

/**
 * Split as the magic does (IPython's `arg_split`, a non-POSIX shlex): on whitespace,
 * a quoted part kept whole and with its quotes, which are part of the value.
 */
export function splitWords(text: string): string[] {
  const words: string[] = [];
  let word = '';
  let quote: string | null = null;
  for (const c of text) {
    if (quote) {
      word += c;
      quote = c === quote ? null : quote;
    } else if (/\s/.test(c)) {
      if (word) {
        words.push(word);
      }
      word = '';
    } else {
      word += c;
      quote = c === '"' || c === "'" ? c : null;
    }
  }
  if (word) {
    words.push(word);
  }
  return words;
}

function longFlag(name: string): IFlag | undefined {
  const exact = BY_NAME.get(name);
  if (exact || !name) {
    return exact;
  }
  const prefixed = FLAGS.filter(f => f.name.startsWith(name)); // argparse's abbreviations
  return prefixed.length === 1 ? prefixed[0] : undefined;
}

/** The flags of a `%%distributed ...` line (or of the words after the magic's name). */
export function parseLine(line: string): IMagicLine {
  const text = line.startsWith(CELL_MAGIC) ? line.slice(CELL_MAGIC.length) : line;
  const words = splitWords(text);
  const parsed = emptyLine();
  for (let i = 0; i < words.length; i++) {
    const word = words[i];
    let flag: IFlag | undefined;
    let inline: string | undefined;
    if (word.startsWith('--')) {
      const eq = word.indexOf('=');
      flag = longFlag(eq < 0 ? word.slice(2) : word.slice(2, eq));
      inline = eq < 0 ? undefined : word.slice(eq + 1);
    } else if (/^-[A-Za-z]/.test(word)) {
      flag = BY_SHORT.get(word[1]);
      inline = word.length > 2 ? word.slice(2).replace(/^=/, '') : undefined;
    }
    if (!flag) {
      parsed.extra.push(word);
      continue;
    }
    if (flag.kind === 'bool') {
      parsed.values[flag.name] = true;
      continue;
    }
    const value = inline ?? (i + 1 < words.length ? words[++i] : '');
    if (flag.kind === 'repeat') {
      const list = (parsed.values[flag.name] as string[] | undefined) ?? [];
      parsed.values[flag.name] = [...list, value];
    } else {
      parsed.values[flag.name] = value;
    }
  }
  return parsed;
}

/** The `%%distributed` line for these values: defaults and empty values left out. */
export function formatLine(line: IMagicLine): string {
  const parts = [CELL_MAGIC];
  for (const flag of FLAGS) {
    const value = line.values[flag.name];
    if (value === undefined || value === false || value === '') {
      continue;
    }
    if (flag.kind === 'bool') {
      parts.push(`--${flag.name}`);
    } else if (Array.isArray(value)) {
      value.forEach(v => parts.push(`--${flag.name}`, v));
    } else if (!sameAsDefault(flag, String(value))) {
      parts.push(`--${flag.name}`, String(value));
    }
  }
  parts.push(...line.extra);
  return parts.join(' ');
}

function sameAsDefault(flag: IFlag, value: string): boolean {
  if (flag.kind === 'float' && flag.default !== '' && isFloat(value)) {
    return parseFloat(value) === parseFloat(flag.default);
  }
  if (flag.kind === 'int' && flag.default !== '' && isInt(value)) {
    return parseInt(value, 10) === parseInt(flag.default, 10);
  }
  return value.trim() === flag.default;
}

/** `source` with its first line set to `line` (added above the code when it has none). */
export function withMagicLine(source: string, line: string): string {
  if (!hasMagic(source)) {
    return source === '' ? line + '\n' : `${line}\n${source}`;
  }
  const newline = source.indexOf('\n');
  return newline < 0 ? line + '\n' : line + source.slice(newline);
}

// --- validation: the magic's own messages ------------------------------------

const MAX_SECONDS = 7 * 24 * 3600;
const MAX_GRACE = 3600;
const MAX_CPU = 4096;
const MAX_GIB = 65536;
const NAME_RE = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,39}$/;
const ENV_KEY_RE = /^[A-Za-z_][A-Za-z0-9_]*$/;
const IDENTIFIER_RE = /^[A-Za-z_][A-Za-z0-9_]*$/;
const USER_RE = /^[a-z_][a-z0-9_.-]{0,31}$/i;
const IFACE_RE = /^[A-Za-z0-9_.:@-]{1,15}$/;
const KERAS = ['auto', 'legacy', 'native'];
const CONTROLLERS = ['gloo', 'mpi'];

function isInt(text: string): boolean {
  return /^\s*[+-]?\d+(_\d+)*\s*$/.test(text);
}

function isFloat(text: string): boolean {
  const t = text.trim();
  return (
    /^[+-]?(\d+(_\d+)*(\.(\d+(_\d+)*)?)?|\.\d+(_\d+)*)([eE][+-]?\d+)?$/.test(t) ||
    /^[+-]?(inf|infinity|nan)$/i.test(t)
  );
}

function toNumber(text: string): number {
  const t = text.trim().replace(/_/g, '').toLowerCase();
  if (/^[+-]?(inf|infinity)$/.test(t)) {
    return t.startsWith('-') ? -Infinity : Infinity;
  }
  return t.endsWith('nan') ? NaN : Number(t);
}

/** Python's `repr` of a str. */
export function pyStr(text: string): string {
  const q = text.includes("'") && !text.includes('"') ? '"' : "'";
  const body = text.replace(/\\/g, '\\\\').replace(new RegExp(q, 'g'), '\\' + q);
  return q + body + q;
}

/** Python's `repr` of a float. */
export function pyFloat(value: number): string {
  if (Number.isNaN(value)) {
    return 'nan';
  }
  if (!Number.isFinite(value)) {
    return value > 0 ? 'inf' : '-inf';
  }
  if (Number.isInteger(value) && Math.abs(value) < 1e16) {
    return value.toFixed(1);
  }
  return String(value);
}

/** Python's `f"{value:g}"` for the whole-number limits used here. */
function pyG(value: number): string {
  return String(value);
}

/** A thrown message: the first problem, one line, as the magic says it. */
export class MagicLineError extends Error {}

function fail(message: string): never {
  throw new MagicLineError(message);
}

function optionOf(flag: IFlag): string {
  return flag.short ? `-${flag.short}/--${flag.name}` : `--${flag.name}`;
}

/** The flag's value as the magic's argparse would give it (a type error as argparse says). */
function converted(line: IMagicLine, name: string): string | number | boolean | string[] | null {
  const flag = BY_NAME.get(name)!;
  const raw = line.values[name];
  if (raw === undefined || (raw === '' && flag.kind !== 'str')) {
    if (flag.kind === 'bool') {
      return false;
    }
    if (flag.kind === 'repeat') {
      return [];
    }
    if (flag.default === '') {
      return null;
    }
    return flag.kind === 'str' ? flag.default : toNumber(flag.default);
  }
  if (flag.kind === 'int') {
    if (!isInt(raw as string)) {
      fail(`argument ${optionOf(flag)}: invalid int value: ${pyStr(raw as string)}`);
    }
    return parseInt((raw as string).replace(/_/g, ''), 10);
  }
  if (flag.kind === 'float') {
    if (!isFloat(raw as string)) {
      fail(`argument ${optionOf(flag)}: invalid float value: ${pyStr(raw as string)}`);
    }
    return toNumber(raw as string);
  }
  return raw;
}

function checkNumber(
  flag: string,
  value: number | null,
  what: string,
  low: number | null,
  high: number,
  optional = false
): void {
  if (value === null && optional) {
    return;
  }
  const ok =
    value !== null &&
    Number.isFinite(value) &&
    (low !== null ? value > low : value >= 0) &&
    value <= high;
  if (!ok) {
    fail(`${flag} must be ${what} and at most ${pyG(high)}, got ${pyFloat(value as number)}`);
  }
}

function names(text: string | null): string[] {
  return text ? text.split(/[,\s]+/).filter(n => n) : [];
}

/**
 * Check a line's values as `%%distributed` does; throws {@link MagicLineError} with the
 * magic's message for the first bad one. Backend and launcher names are checked by the
 * magic only when the job is submitted, so not here.
 */
export function validateLine(line: IMagicLine): void {
  const v = (name: string) => converted(line, name);
  if (line.extra.length) {
    fail(`unrecognized arguments: ${line.extra.join(' ')}`);
  }
  const workers = v('workers') as number;
  const ps = v('ps') as number;
  const backend = v('backend') as string;
  const launcher = v('launcher') as string;
  const gpus = v('gpus') as number;
  const sshPort = v('ssh-port') as number;
  const batch = v('batch-size') as number | null;
  const nums = ['cpu', 'memory', 'timeout', 'grace', 'hang-timeout', 'stall-timeout'].map(v);
  const [cpu, memory, timeout, grace, hang, stall] = nums as (number | null)[];
  const gpuIds = names(v('gpu-ids') as string | null);
  for (const pair of v('env') as string[]) {
    const eq = pair.indexOf('=');
    if (eq <= 0) {
      fail(`--env expects KEY=VALUE, got ${pyStr(pair)}`);
    }
  }
  // JobSpec.validate, in its order
  if (workers < 1) {
    fail(`--workers must be a whole number >= 1, got ${workers}`);
  }
  if (ps < 0) {
    fail(`--ps must be a whole number >= 0, got ${ps}`);
  }
  if (backend === 'ps' && ps < 1) {
    fail('--backend ps needs --ps N with N >= 1 parameter servers');
  }
  if (ps && backend !== 'auto' && backend !== 'ps') {
    fail(`--ps is for the parameter-server backend, not --backend ${backend}`);
  }
  const keras = v('keras') as string;
  if (!KERAS.includes(keras)) {
    fail(`--keras must be one of ${KERAS.join(', ')}, got ${pyStr(keras)}`);
  }
  const controller = v('controller') as string;
  if (!CONTROLLERS.includes(controller)) {
    fail(`--controller must be one of ${CONTROLLERS.join(', ')}, got ${pyStr(controller)}`);
  }
  checkNumber('--cpu', cpu, 'a number of cores > 0', 0, MAX_CPU, true);
  checkNumber('--memory', memory, 'a number of GiB > 0', 0, MAX_GIB, true);
  if (gpus < 0) {
    fail(`--gpus must be a whole number >= 0, got ${gpus}`);
  }
  if (gpuIds.length && !gpus) {
    fail('--gpu-ids needs --gpus N (the GPUs each worker gets)');
  }
  if (sshPort < 1 || sshPort > 65535) {
    fail(`--ssh-port must be a port number 1-65535, got ${sshPort}`);
  }
  const user = v('ssh-user') as string;
  if (user && !USER_RE.test(user)) {
    fail(`--ssh-user: ${pyStr(user)} is not a user name`);
  }
  const iface = v('network-interface') as string;
  if (iface && !IFACE_RE.test(iface)) {
    fail(`--network-interface: ${pyStr(iface)} is not an interface name`);
  }
  if (v('hosts') && launcher === 'local') {
    fail('--hosts is for a multi-host launcher: add --launcher ssh');
  }
  if (v('address') && launcher !== 'ray') {
    fail('--address is for the Ray launcher: add --launcher ray');
  }
  if (batch !== null && batch < 1) {
    fail(`--batch-size must be >= 1, got ${batch}`);
  }
  checkNumber('--timeout', timeout, 'a number of seconds > 0', 0, MAX_SECONDS);
  checkNumber('--grace', grace, 'a number of seconds >= 0', null, MAX_GRACE);
  checkNumber('--hang-timeout', hang, 'seconds >= 0', null, MAX_SECONDS);
  checkNumber('--stall-timeout', stall, 'seconds >= 0', null, MAX_SECONDS);
  const name = v('name') as string;
  if (!NAME_RE.test(name)) {
    fail(`--name must be 1-40 letters, digits, '_', '.' or '-', got ${pyStr(name)}`);
  }
  for (const pair of v('env') as string[]) {
    const key = pair.slice(0, pair.indexOf('='));
    if (!ENV_KEY_RE.test(key)) {
      fail(`--env: ${pyStr(key)} is not a valid environment variable name`);
    }
  }
  const out = v('out') as string | null;
  for (const n of [...names(v('push') as string | null), ...(out ? [out] : [])]) {
    if (!IDENTIFIER_RE.test(n)) {
      fail(`${pyStr(n)} is not a valid Python variable name`);
    }
  }
}

/** The first problem's message, or null when the magic would take the line. */
export function lineError(line: IMagicLine): string | null {
  try {
    validateLine(line);
    return null;
  } catch (err) {
    if (err instanceof MagicLineError) {
      return err.message;
    }
    throw err;
  }
}

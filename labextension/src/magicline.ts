/**
 * The `%%distributed` first line of a cell: parse it into flag values and write it back
 * from them. The flags are the magic's own table, served by the server extension
 * (`GET /distrain/flags`, jupyter_distrain/client/flags.py): a launcher's options come
 * with it, and nothing here lists a flag. Whether the magic would take a line is asked
 * of the server too (`checkLine` in api.ts), in the magic's own words.
 */

export const CELL_MAGIC = '%%distributed';

export type FlagKind = 'int' | 'float' | 'str' | 'bool' | 'repeat';

export interface IFlag {
  /** The long name without dashes, e.g. `workers`. */
  name: string;
  kind: FlagKind;
  /** The default as the magic has it ('' for none); the line leaves defaults out. */
  default: string;
  /** The short name without its dash ('' for none), e.g. `n`. */
  short: string;
  help: string;
  /** The values the magic takes ([]: any). */
  choices: string[];
  /** The launcher option it sets ('' for a flag of the job itself), e.g. `ssh_port`. */
  option: string;
  /** The launchers declaring that option. */
  launchers: string[];
}

/** What `GET /distrain/flags` answers: the flags in a written line's order. */
export interface IFlagTable {
  flags: IFlag[];
  backends: string[];
  launchers: string[];
}

let TABLE: IFlagTable = { flags: [], backends: [], launchers: [] };
let BY_NAME = new Map<string, IFlag>();
let BY_SHORT = new Map<string, IFlag>();

/** Use `table` (the server's) from now on. */
export function setFlagTable(table: IFlagTable): void {
  TABLE = table;
  BY_NAME = new Map(table.flags.map(f => [f.name, f]));
  BY_SHORT = new Map(table.flags.filter(f => f.short).map(f => [f.short, f]));
}

/** The flag table in use (empty until the server's has come). */
export function flagTable(): IFlagTable {
  return TABLE;
}

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
  const prefixed = TABLE.flags.filter(f => f.name.startsWith(name)); // argparse's abbreviations
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
  for (const flag of TABLE.flags) {
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

function isInt(text: string): boolean {
  return /^\s*[+-]?\d+(_\d+)*\s*$/.test(text);
}

function isFloat(text: string): boolean {
  return /^[+-]?(\d+(_\d+)*(\.(\d+(_\d+)*)?)?|\.\d+(_\d+)*)([eE][+-]?\d+)?$/.test(text.trim());
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

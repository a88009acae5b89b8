import {
  formatLine,
  hasMagic,
  IFlagTable,
  lineFromDefaults,
  parseLine,
  setFlagTable,
  splitWords,
  withMagicLine
} from '../magicline';

// what GET /distrain/flags answers (tests/test_labextension.py checks that it is)
import flags from './flags.json';

beforeAll(() => setFlagTable(flags as IFlagTable));

describe('splitWords', () => {
  it('splits as the magic does: quotes kept, a quoted part whole', () => {
    expect(splitWords(` -n 2  --name 'a b' --env "K=x y"\tc\\ d`)).toEqual([
      '-n',
      '2',
      '--name',
      "'a b'",
      '--env',
      '"K=x y"',
      'c\\',
      'd'
    ]);
  });
});

describe('parseLine and formatLine', () => {
  it('reads every spelling of a flag', () => {
    const line = parseLine('%%distributed -n 3 --ps=1 --backend ps --env A=1 --env B=2 --no-pool');
    expect(line.values).toEqual({
      workers: '3',
      ps: '1',
      backend: 'ps',
      env: ['A=1', 'B=2'],
      'no-pool': true
    });
    expect(parseLine('%%distributed -n4').values.workers).toBe('4');
    expect(parseLine('%%distributed --work 5').values.workers).toBe('5');
  });

  it('writes flags in order, leaves defaults out and keeps unknown words', () => {
    const line = parseLine(
      '%%distributed --name my-job --workers 2 --timeout 120.0 --launcher local --weird x'
    );
    expect(formatLine(line)).toBe('%%distributed --workers 2 --name my-job --weird x');
  });

  it('round-trips a written line', () => {
    const text =
      '%%distributed --workers 4 --ps 1 --backend ps --cpu 0.5 --env A=x --env B=1 --background';
    expect(formatLine(parseLine(text))).toBe(text);
  });
});

describe('hasMagic and withMagicLine', () => {
  it('knows the cell magic from others', () => {
    expect(hasMagic('%%distributed --workers 2\nx = 1')).toBe(true);
    expect(hasMagic('%%distributed')).toBe(true);
    expect(hasMagic('%%distributedx\n')).toBe(false);
    expect(hasMagic('%%distributed?')).toBe(false);
    expect(hasMagic('x = 1')).toBe(false);
  });

  it('adds or replaces the first line', () => {
    expect(withMagicLine('x = 1', '%%distributed -n 2')).toBe('%%distributed -n 2\nx = 1');
    expect(withMagicLine('%%distributed\nx = 1', '%%distributed --workers 2')).toBe(
      '%%distributed --workers 2\nx = 1'
    );
    expect(withMagicLine('', '%%distributed')).toBe('%%distributed\n');
  });
});

describe('lineFromDefaults', () => {
  it('turns the formDefaults setting into a line, leaving out what is no flag', () => {
    const { line, unknown } = lineFromDefaults({
      workers: 2,
      launcher: 'ssh',
      hosts: '10.0.0.5:2,10.0.0.6:2',
      'no-pool': true,
      env: ['A=1', ' B=2 '],
      '--name': 'team',
      colour: 'blue'
    });
    expect(unknown).toEqual(['colour']);
    expect(formatLine(line)).toBe(
      '%%distributed --workers 2 --launcher ssh --env A=1 --env B=2 --name team --no-pool --hosts 10.0.0.5:2,10.0.0.6:2'
    );
  });

  it('takes --env as text with one variable a line, and a switch written as text', () => {
    const { line } = lineFromDefaults({ env: 'A=1\nB=2', background: 'true', 'all-output': false });
    expect(line.values).toEqual({ env: ['A=1', 'B=2'], background: true, 'all-output': false });
  });
});

import { RateSeries, sparkline } from '../series';

describe('RateSeries', () => {
  it('sums the latest rate of each process, one point a second', () => {
    const series = new RateSeries();
    series.add([
      { role: 'worker', index: 0, time: 100.1, images_per_sec: 10 },
      { role: 'worker', index: 1, time: 100.2, images_per_sec: 20 },
      { role: 'worker', index: 0, time: 101.5, images_per_sec: 12 },
      { role: 'worker', index: 0, time: 101.9, heartbeat: true }
    ]);
    expect(series.points).toEqual([30, 32]);
  });

  it('drops a process unheard for 10 seconds and keeps the last points', () => {
    const series = new RateSeries(3);
    series.add([
      { role: 'worker', index: 0, time: 1, images_per_sec: 5 },
      { role: 'worker', index: 1, time: 2, images_per_sec: 5 },
      { role: 'worker', index: 1, time: 12, images_per_sec: 6 },
      { role: 'worker', index: 1, time: 13, images_per_sec: 7 }
    ]);
    expect(series.points).toEqual([10, 6, 7]);
  });
});

describe('sparkline', () => {
  it('draws the values scaled into its box', () => {
    const svg = sparkline([0, 4, 8], 100, 20);
    expect(svg.getAttribute('viewBox')).toBe('0 0 100 20');
    expect(svg.querySelector('polyline')!.getAttribute('points')).toBe(
      '0.0,19.0 50.0,11.8 100.0,4.6'
    );
    expect(sparkline([5]).querySelector('polyline')).toBeNull();
  });
});

import { RateSeries, sparkline } from '../series';

describe('RateSeries', () => {
  it('keeps one point per poll, the last ones', () => {
    const series = new RateSeries(3);
    for (const rate of [10, 30, 32, 6]) {
      series.add(rate);
    }
    expect(series.points).toEqual([30, 32, 6]);
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

/**
 * Galata's Playwright configuration, with Debian's Chromium (never a downloaded
 * browser) and the server of start-server.sh.
 */
const baseConfig = require('@jupyterlab/galata/lib/playwright-config');

const port = process.env.UI_TESTS_PORT || '8917';

module.exports = {
  ...baseConfig,
  timeout: 120 * 1000,
  retries: 0,
  workers: 1,
  outputDir: 'test-results/output',
  reporter: [['list'], ['html', { open: 'never', outputFolder: 'playwright-report' }]],
  use: {
    ...baseConfig.use,
    baseURL: `http://127.0.0.1:${port}`,
    launchOptions: { executablePath: process.env.CHROMIUM || '/usr/bin/chromium' },
    trace: 'retain-on-failure',
    video: 'off'
  },
  webServer: {
    command: './start-server.sh',
    url: `http://127.0.0.1:${port}/lab`,
    timeout: 120 * 1000,
    reuseExistingServer: false,
    // SIGTERM, not Playwright's default SIGKILL: start-server.sh then stops any job
    // left running and removes its temporary directory
    gracefulShutdown: { signal: 'SIGTERM', timeout: 30000 }
  }
};

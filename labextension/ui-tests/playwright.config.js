/**
 * Galata's Playwright configuration, with Debian's Chromium (never a downloaded
 * browser) and the server of start-server.sh: one Jupyter server under a JupyterHub
 * user's base URL (/user/alice/) that serves both front-ends, JupyterLab (/lab, the
 * `jupyterlab` project) and Notebook 7 (/tree and /notebooks, the `notebook` project);
 * run as root, also a real JupyterHub for the `hub` project (tests/hub.spec.ts).
 */
const baseConfig = require('@jupyterlab/galata/lib/playwright-config');
const crypto = require('crypto');

const port = process.env.UI_TESTS_PORT || '8917';
// read by start-server.sh's server configuration and by tests/helpers.ts as well
process.env.UI_TESTS_BASE_PATH = process.env.UI_TESTS_BASE_PATH || '/user/alice/';
const server = `http://127.0.0.1:${port}${process.env.UI_TESTS_BASE_PATH}`;
// a real JupyterHub (tests/hubserver.py) for tests/hub.spec.ts: it spawns the test
// accounts' servers as them, so it runs where the tests run as root (as make test does)
const withHub = process.getuid && process.getuid() === 0;
process.env.UI_TESTS_HUB_PORT = process.env.UI_TESTS_HUB_PORT || '8918';
process.env.UI_TESTS_HUB_PASSWORD =
  process.env.UI_TESTS_HUB_PASSWORD || crypto.randomBytes(12).toString('hex');
const hubServer = {
  command: `../../.venv/bin/python ../../tests/hubserver.py ${process.env.UI_TESTS_HUB_PORT}`,
  url: `http://127.0.0.1:${process.env.UI_TESTS_HUB_PORT}/hub/api/`,
  timeout: 120 * 1000,
  reuseExistingServer: false,
  gracefulShutdown: { signal: 'SIGTERM', timeout: 30000 }
};

module.exports = {
  ...baseConfig,
  timeout: 120 * 1000,
  retries: 0,
  workers: 1,
  outputDir: 'test-results/output',
  reporter: [['list'], ['html', { open: 'never', outputFolder: 'playwright-report' }]],
  use: {
    ...baseConfig.use,
    // Galata joins baseURL and appPath: no trailing slash here
    baseURL: server.replace(/\/$/, ''),
    launchOptions: { executablePath: process.env.CHROMIUM || '/usr/bin/chromium' },
    trace: 'retain-on-failure',
    video: 'off'
  },
  projects: [
    { name: 'jupyterlab', testIgnore: /(notebook7|hub)\.spec\.ts/ },
    { name: 'notebook', testMatch: /notebook7\.spec\.ts/, use: { appPath: '' } },
    ...(withHub ? [{ name: 'hub', testMatch: /hub\.spec\.ts/ }] : [])
  ],
  webServer: [
    {
      command: './start-server.sh',
      url: `${server}lab`,
      timeout: 120 * 1000,
      reuseExistingServer: false,
      // SIGTERM, not Playwright's default SIGKILL: start-server.sh then stops any job
      // left running and removes its temporary directory
      gracefulShutdown: { signal: 'SIGTERM', timeout: 30000 }
    },
    ...(withHub ? [hubServer] : [])
  ]
};

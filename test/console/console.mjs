// Drives cagebox's web console in headless Chromium (Debian's
// /usr/bin/chromium) with playwright-core, as a tenant (API-key login on the
// daemon's --listen address) and as the admin (the one-time link of
// `cagebox console`). test/e2e/console_test.go starts the daemon, makes the
// tenant, its key and sandbox, and reads the JSON report this prints:
// {checks: [{name, ok, detail}], skipped: [{name, why}], fatal}.
import { chromium } from 'playwright-core';
import { execFileSync } from 'node:child_process';

const env = (k) => { const v = process.env[k]; if (!v) throw new Error(`${k} is not set`); return v; };
const BASE = env('CONSOLE_BASE'); // http://127.0.0.1:PORT (the --listen address)
const KEY = env('TENANT_KEY');
const SANDBOX = env('TENANT_SANDBOX');
const OTHER = env('OTHER_SANDBOX'); // another tenant's: never shown to this one
const CAGEBOX = env('CAGEBOX_BIN'); // the CLI, for `cagebox console`
const HOME = env('CAGEBOX_HOME');
const SECRET1 = env('SECRET_VALUE');
const SECRET2 = env('SECRET_VALUE2');
const TENANT = env('TENANT');

const report = { checks: [], skipped: [] };
const check = (name, ok, detail) => { report.checks.push({ name, ok: !!ok, detail: detail === undefined ? '' : String(detail).slice(0, 2000) }); };
const skip = (name, why) => report.skipped.push({ name, why });

// instrument records CSP violations, console errors and every response
// body of a page.
async function instrument(ctx) {
  const rec = { violations: [], consoleErrors: [], bodies: [] };
  await ctx.addInitScript(() => {
    window.__csp = [];
    document.addEventListener('securitypolicyviolation', (e) => window.__csp.push(`${e.violatedDirective} ${e.blockedURI} ${e.sample}`));
  });
  ctx.on('page', (p) => watch(p, rec));
  ctx.setDefaultTimeout(15000);
  return rec;
}
function watch(page, rec) {
  page.on('console', (m) => {
    if (m.type() === 'error') rec.consoleErrors.push(m.text());
    if (/Content Security Policy/i.test(m.text())) rec.violations.push(m.text());
  });
  page.on('response', async (r) => {
    try { rec.bodies.push({ url: r.url(), status: r.status(), body: await r.text() }); } catch { /* streamed or gone */ }
  });
}

async function waitText(locator, re, timeout = 15000) {
  const t0 = Date.now();
  let last = '';
  while (Date.now() - t0 < timeout) {
    last = (await locator.textContent().catch(() => '')) || '';
    if (re.test(last)) return last;
    await new Promise(r => setTimeout(r, 100));
  }
  throw new Error(`waited ${timeout} ms for ${re}, last text: ${last.slice(-300)}`);
}

// shot saves a screenshot of a page as docs' picture of it when
// CONSOLE_SHOTS names a directory (docs/console/ is made this way:
// CONSOLE_SHOTS=$PWD/docs/console go test -run TestConsole ./test/e2e/).
async function shot(page, name) {
  if (!process.env.CONSOLE_SHOTS) return;
  await page.waitForTimeout(300);
  await page.screenshot({ path: `${process.env.CONSOLE_SHOTS}/${name}.png` }).catch((e) => process.stderr.write(`screenshot ${name}: ${e}\n`));
}

let current = null; // the page steps act on, for screenshots
let shots = 0;
async function step(name, fn) {
  const t0 = Date.now();
  try { await fn(); } catch (e) {
    check(name, false, e.stack || e.message);
    if (process.env.SCREENSHOT_DIR && current) await current.screenshot({ path: `${process.env.SCREENSHOT_DIR}/fail-${++shots}.png` }).catch(() => {});
  }
  process.stderr.write(`step ${name}: ${Date.now() - t0} ms\n`);
}

async function tenantFlow(browser) {
  const ctx = await browser.newContext();
  const rec = await instrument(ctx);
  const page = await ctx.newPage();
  page.setDefaultTimeout(15000);
  page.setDefaultNavigationTimeout(15000);
  current = page;

  await step('login: unauthenticated /ui/ redirects to the login page', async () => {
    await page.goto(BASE + '/ui/');
    await shot(page, 'login');
    check('login: unauthenticated /ui/ redirects to the login page', new URL(page.url()).pathname === '/ui/login', page.url());
  });
  await step('login: a wrong key is refused with a message', async () => {
    await page.fill('#key', 'cbk_' + '0'.repeat(64));
    const [resp] = await Promise.all([page.waitForResponse(r => r.url().endsWith('/ui/login') && r.request().method() === 'POST'), page.click('button[type=submit]')]);
    const msg = await page.textContent('#login-error');
    check('login: a wrong key is refused with a message', resp.status() === 401 && /Unknown or revoked/.test(msg), `${resp.status()} ${msg}`);
  });
  await step('login: the key logs in', async () => {
    await page.fill('#key', KEY);
    await Promise.all([page.waitForURL(BASE + '/ui/'), page.click('button[type=submit]')]);
    await page.waitForSelector(`#sandboxes tr[data-id="${SANDBOX}"]`);
    check('login: the key logs in', true);
    await shot(page, 'sandboxes');
  });
  await step('cookie: HttpOnly, Secure, SameSite=Strict, accepted on http://127.0.0.1', async () => {
    const cs = (await ctx.cookies()).filter(c => c.name === 'cagebox_session');
    const c = cs[0] || {};
    check('cookie: HttpOnly, Secure, SameSite=Strict, accepted on http://127.0.0.1', cs.length === 1 && c.httpOnly && c.secure && c.sameSite === 'Strict' && c.path === '/', JSON.stringify(cs.map(x => ({ ...x, value: '…' }))));
    const fromJS = await page.evaluate(() => document.cookie);
    check('cookie: not readable from JavaScript', !fromJS.includes('cagebox_session'), fromJS);
  });
  await step('tenant: sees only its sandboxes, no tenant page', async () => {
    const ids = await page.$$eval('#sandboxes tbody tr', rs => rs.map(r => r.dataset.id));
    const tenantsHidden = await page.isHidden('#nav-tenants');
    check('tenant: sees only its sandboxes, no tenant page', ids.includes(SANDBOX) && !ids.includes(OTHER) && tenantsHidden, `ids=${ids} tenantsHidden=${tenantsHidden}`);
    const who = await page.textContent('#who');
    check('tenant: the header names the tenant', who.includes(TENANT), who);
  });
  await step('detail: runtime, isolation class, limits', async () => {
    await page.click(`#sandboxes a[href="#/sandboxes/${SANDBOX}"]`);
    await page.waitForSelector('#sandbox-detail');
    const rt = await page.textContent('#sandbox-runtime');
    const cls = await page.textContent('#sandbox-class');
    const mem = await page.textContent('#sandbox-memory');
    const st = await page.textContent('#sandbox-status');
    check('detail: runtime, isolation class, limits', rt.length > 0 && /namespaces|app-kernel|hypervisor/.test(cls) && /iB/.test(mem) && st === 'running', `${rt} ${cls} ${mem} ${st}`);
    await shot(page, 'sandbox-detail');
  });
  await step('egress log: the sandbox\'s denied request is listed live', async () => {
    await page.waitForSelector('.event-log tr[data-kind="egress.deny"]', { timeout: 15000 });
    const row = await page.textContent('.event-log tr[data-kind="egress.deny"]');
    check('egress log: the sandbox\'s denied request is listed live', /deny/.test(row) && /no-blocked/.test(row) && /blocked\.example\.test:80/.test(row), row);
  });
  await step('policy: an invalid document shows the error in place', async () => {
    await page.fill('#policy-text', '{"version": 1, "default": "deny", "rules": [{"name": "bad", "host": "*.com", "action": "allow"}]}');
    await page.click('#policy-save');
    const err = await waitText(page.locator('#policy-error'), /\S/);
    check('policy: an invalid document shows the error in place', /com|public suffix|wildcard/i.test(err), err);
    await shot(page, 'policy-error');
  });
  await step('policy: a valid document is saved', async () => {
    await page.fill('#policy-text', JSON.stringify({ version: 1, default: 'deny', rules: [{ name: 'docs', host: 'docs.example.test', action: 'allow' }] }));
    await page.click('#policy-save');
    const info = await waitText(page.locator('#policy-info'), /saved/);
    const err = await page.textContent('#policy-error');
    const text = await page.inputValue('#policy-text');
    check('policy: a valid document is saved', /generation \d+/.test(info) && err === '' && text.includes('docs.example.test'), `${info} | ${err}`);
  });
  await step('approvals: a waiting request is approved from the queue', async () => {
    // The agent's side: request access through the API with the key; it
    // waits for an operator's decision.
    const pending = fetch(`${BASE}/v1/sandboxes/${SANDBOX}/access`, {
      method: 'POST', headers: { Authorization: 'Bearer ' + KEY, 'Content-Type': 'application/json' },
      body: JSON.stringify({ host: 'api.example.test', reason: 'console e2e', timeout: '60s' }),
    }).then(r => r.json());
    await page.goto(BASE + '/ui/#/approvals');
    let found = false;
    for (let i = 0; i < 50 && !found; i++) {
      await page.click('#approvals-refresh');
      found = await page.locator('#approvals tr', { hasText: 'console e2e' }).count() > 0;
      if (!found) await page.waitForTimeout(200);
    }
    if (!found) throw new Error('the approval never showed in the queue');
    await shot(page, 'approvals');
    await page.locator('#approvals tr', { hasText: 'console e2e' }).locator('.btn-approve').click();
    const res = await pending;
    check('approvals: a waiting request is approved from the queue', res.allowed === true, JSON.stringify(res));
  });
  await step('secrets: add, rotate, revoke without the value in the page', async () => {
    await page.goto(BASE + '/ui/#/secrets');
    await page.waitForSelector('#add-secret');
    await page.fill('#add-secret input[name=name]', 'CONSOLE_TOKEN');
    await page.fill('#add-secret input[name=value]', SECRET1);
    await page.fill('#add-secret input[name=hosts]', 'api.example.test');
    await page.click('#add-secret button[type=submit]');
    const row = page.locator('#secrets tr[data-name="CONSOLE_TOKEN"]');
    await row.waitFor();
    const valueLeft = await page.inputValue('#add-secret input[name=value]');
    const t1 = await row.textContent();
    check('secrets: added, showing preview and hosts; the input is cleared', valueLeft === '' && t1.includes('api.example.test') && t1.includes(SECRET1.slice(-4)) && !t1.includes(SECRET1), t1);
    await shot(page, 'secrets');
    const v1 = Number(await row.locator('td.num').textContent());
    await row.locator('.rotate-value').fill(SECRET2);
    await row.locator('.btn-rotate').click();
    await waitText(page.locator('#secrets tr[data-name="CONSOLE_TOKEN"]'), new RegExp(SECRET2.slice(-4)));
    const t2 = await page.locator('#secrets tr[data-name="CONSOLE_TOKEN"]').textContent();
    const v2 = Number(await page.locator('#secrets tr[data-name="CONSOLE_TOKEN"] td.num').textContent());
    check('secrets: rotated (next version, new preview)', v2 === v1 + 1 && t2.includes(SECRET2.slice(-4)), `${v1} → ${v2}: ${t2}`);
    await page.locator('#secrets tr[data-name="CONSOLE_TOKEN"] .btn-revoke').click();
    const t3 = await waitText(page.locator('#secrets tr[data-name="CONSOLE_TOKEN"]'), /revoked/);
    check('secrets: revoked', /revoked/.test(t3), t3);
    const dom = await page.evaluate(() => document.documentElement.outerHTML + [...document.querySelectorAll('input,textarea')].map(e => e.value).join('\n'));
    check('secrets: no value anywhere in the DOM', !dom.includes(SECRET1) && !dom.includes(SECRET2), 'DOM length ' + dom.length);
    const leaks = rec.bodies.filter(b => b.body.includes(SECRET1) || b.body.includes(SECRET2)).map(b => b.url);
    check('secrets: no value in any network response', leaks.length === 0, leaks.join(' '));
  });
  await step('terminal', async () => {
    await page.goto(`${BASE}/ui/#/sandboxes/${SANDBOX}`);
    await page.waitForSelector('#open-terminal');
    await page.click('#open-terminal');
    await page.waitForSelector('#terminal .xterm');
    const st = await page.locator('#term-status');
    const t0 = Date.now();
    let state = '';
    while (Date.now() - t0 < 15000) {
      state = await st.getAttribute('data-state') || '';
      if (state) break;
      await page.waitForTimeout(100);
    }
    if (state !== 'open') {
      const txt = await st.textContent();
      const probe = await page.evaluate(async (id) => (await fetch(`/v1/sandboxes/${id}/pty`)).status, SANDBOX);
      if (probe === 404 || probe === 405) { skip('terminal', `the pty WebSocket endpoint is not in this daemon (GET /pty answered ${probe}; status "${txt}")`); return; }
      throw new Error(`terminal did not connect: ${state} ${txt} (GET /pty: ${probe})`);
    }
    await page.click('#terminal');
    await page.keyboard.type('echo hi-$((40+2))\n');
    await waitText(page.locator('#terminal .xterm-rows'), /hi-42/);
    check('terminal: typed `echo` runs and its output shows', true);
    await page.evaluate(() => document.getElementById('terminal').dispatchEvent(new CustomEvent('cbx-resize', { detail: { rows: 21, cols: 77 } })));
    await page.waitForTimeout(300);
    await page.keyboard.type('stty size\n');
    const out = await waitText(page.locator('#terminal .xterm-rows'), /21 77/);
    check('terminal: resize reaches the pty', /21 77/.test(out), out.slice(-200));
    await shot(page, 'terminal');
    await page.keyboard.type('exit 3\n');
    const ex = await waitText(page.locator('#term-status'), /exited/);
    check('terminal: exit status shown', /code 3/.test(ex), ex);
  });
  await step('create: the form makes a sandbox, and it can be removed', async () => {
    await page.goto(`${BASE}/ui/#/sandboxes`);
    await page.waitForSelector('#create-sandbox');
    await page.selectOption('#create-sandbox select[name=image]', 'busybox');
    await page.fill('#create-sandbox input[name=memory]', '128');
    await page.click('#create-sandbox button[type=submit]');
    await page.waitForURL(/#\/sandboxes\/sb-/, { timeout: 30000 });
    const mem = await waitText(page.locator('#sandbox-memory'), /128 MiB/);
    const st = await page.textContent('#sandbox-status');
    check('create: the form makes a sandbox with the limits asked', st === 'running' && mem === '128 MiB', `${st} ${mem}`);
    await page.click('#btn-rm');
    await page.waitForSelector('#sandboxes');
  });
  await step('buttons: pause, resume, stop, remove', async () => {
    await page.goto(`${BASE}/ui/#/sandboxes/${SANDBOX}`);
    await page.waitForSelector('#btn-pause:not([disabled])');
    await page.click('#btn-pause');
    const p = await waitText(page.locator('#sandbox-status'), /paused/);
    await page.click('#btn-resume');
    const r = await waitText(page.locator('#sandbox-status'), /running/);
    await page.click('#btn-stop');
    const s = await waitText(page.locator('#sandbox-status'), /stopped/, 30000);
    check('buttons: pause, resume, stop change the status', p && r && s, `${p} ${r} ${s}`);
    await page.click('#btn-rm');
    await page.waitForSelector('#sandboxes');
    await page.waitForTimeout(300);
    const gone = await page.locator(`#sandboxes tr[data-id="${SANDBOX}"]`).count();
    check('buttons: remove takes the sandbox off the list', gone === 0, gone);
  });
  check('csp: no violation while using the console', rec.violations.length === 0 && (await page.evaluate(() => window.__csp)).length === 0,
    JSON.stringify({ console: rec.violations, events: await page.evaluate(() => window.__csp) }));
  await step('csp: an injected inline script does not run', async () => {
    const ran = await page.evaluate(async () => {
      const s = document.createElement('script');
      s.textContent = 'window.__pwned = 1';
      document.body.append(s);
      const d = document.createElement('div');
      d.innerHTML = '<img src=x onerror="window.__pwned2=1">';
      document.body.append(d);
      await new Promise(r => setTimeout(r, 300));
      return { a: window.__pwned, b: window.__pwned2, v: window.__csp.length };
    });
    check('csp: an injected inline script does not run', ran.a === undefined && ran.b === undefined && ran.v >= 1, JSON.stringify(ran));
  });
  await step('csrf: a state-changing request without the token is refused', async () => {
    const st = await page.evaluate(async () => (await fetch('/v1/secrets', { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ name: 'X', value: 'y', hosts: ['a.example.test'] }) })).status);
    check('csrf: a state-changing request without the token is refused', st === 403, st);
  });
  await step('logout ends the session', async () => {
    await Promise.all([page.waitForURL(/\/ui\/login/), page.click('#logout button')]);
    const st = await page.evaluate(async () => (await fetch('/v1/sandboxes')).status);
    check('logout ends the session', st === 401, st);
  });
  await ctx.close();
}

async function adminFlow(browser) {
  const ctx = await browser.newContext();
  const rec = await instrument(ctx);
  const page = await ctx.newPage();
  page.setDefaultTimeout(15000);
  page.setDefaultNavigationTimeout(15000);
  current = page;
  let key = '';
  // The link is good for a minute: ask for it now.
  const ADMIN_URL = execFileSync(CAGEBOX, ['--home', HOME, 'console'], { encoding: 'utf8' }).trim();
  check('cli: cagebox console prints a loopback link', /^http:\/\/127\.0\.0\.1:\d+\/ui\/login\?token=[\w-]{43}$/.test(ADMIN_URL), ADMIN_URL.replace(/token=.*/, 'token=…'));
  await step('admin: the one-time link logs in and leaves a clean URL', async () => {
    await page.goto(ADMIN_URL);
    await page.waitForSelector('#sandboxes');
    const u = new URL(page.url());
    check('admin: the one-time link logs in and leaves a clean URL', u.pathname === '/ui/' && !u.search.includes('token'), page.url());
    const ids = await page.$$eval('#sandboxes tbody tr', rs => rs.map(r => r.dataset.id));
    check('admin: sees every tenant\'s sandboxes', ids.includes(OTHER), ids.join(' '));
  });
  await step('admin: the tools page lists registered tools', async () => {
    await page.click('#nav a[href="#/tools"]');
    await page.waitForSelector('#tools');
    await shot(page, 'tools');
    check('admin: the tools page lists registered tools', await page.locator('#tools').count() === 1);
  });
  await step('admin: a new tenant key is shown once', async () => {
    await page.click('#nav-tenants');
    const row = page.locator(`#tenants tr[data-id="${TENANT}"]`);
    await row.waitFor();
    await row.locator('.btn-key').click();
    key = (await page.textContent('#new-key-value', { timeout: 10000 })).trim();
    check('admin: a new tenant key is shown', /^cbk_[0-9a-f]{64}$/.test(key), key.slice(0, 8));
    const ok = await fetch(BASE + '/v1/health', { headers: { Authorization: 'Bearer ' + key } });
    check('admin: the shown key works', ok.status === 200, ok.status);
    await page.click('#key-done');
    await page.reload();
    await page.waitForSelector('#tenants');
    await shot(page, 'tenants');
    const html = await page.content();
    check('admin: the key is not shown again', !html.includes(key), '');
  });
  check('admin: no CSP violation', rec.violations.length === 0, rec.violations.join('\n'));
  await ctx.close();
  await step('admin: the link does not work twice', async () => {
    const c2 = await browser.newContext();
    const p2 = await c2.newPage();
    const resp = await p2.goto(ADMIN_URL);
    const err = await p2.textContent('#login-error').catch(() => '');
    check('admin: the link does not work twice', resp.status() === 401 && /already used/.test(err) && new URL(p2.url()).pathname === '/ui/login', `${resp.status()} ${err}`);
    await c2.close();
  });
}

async function main() {
  // A hung browser must not hang the test.
  setTimeout(() => { report.fatal = 'console.mjs ran over 4 minutes'; process.stdout.write(JSON.stringify(report)); process.exit(1); }, 240000).unref();
  const browser = await chromium.launch({ executablePath: process.env.CHROMIUM || '/usr/bin/chromium', args: ['--no-sandbox'] });
  try {
    await tenantFlow(browser);
    await adminFlow(browser);
  } finally {
    await browser.close();
  }
}

main().then(() => { process.stdout.write(JSON.stringify(report)); }, (e) => {
  report.fatal = e.stack || String(e);
  process.stdout.write(JSON.stringify(report));
});

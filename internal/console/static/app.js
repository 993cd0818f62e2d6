// cagebox console: a single-page app over the daemon's /v1 API. Every
// element is built with the DOM API and text nodes (never by parsing HTML), so
// nothing the API returns is ever parsed as markup; the CSP forbids inline
// script and style besides.
import { openTerminal } from './term.js';

let session = null; // GET /ui/session: tenant, admin, csrf
let cleanup = []; // run when the page changes (streams, sockets)

// h builds an element: h('a', {href: '#/x', onclick: f}, 'text', child…).
// attrs may be left out: a string, node, array or null there is a child.
export function h(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  if (attrs === null || attrs === undefined || typeof attrs !== 'object' || attrs instanceof Node || Array.isArray(attrs)) {
    kids.unshift(attrs);
    attrs = {};
  }
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else if (k === 'class') e.className = v;
    else if (k === 'value') e.value = v;
    else e.setAttribute(k, v === true ? '' : String(v));
  }
  for (const c of kids.flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    e.append(c instanceof Node ? c : String(c));
  }
  return e;
}

class APIError extends Error {
  constructor(msg, status) { super(msg); this.status = status; }
}

// api calls the daemon's REST API with the session cookie; state-changing
// requests carry the session's CSRF token.
export async function api(method, path, body, contentType) {
  const headers = {};
  if (method !== 'GET' && method !== 'HEAD') headers['X-CSRF-Token'] = session.csrf;
  let b;
  if (body !== undefined) {
    if (typeof body === 'string') { b = body; headers['Content-Type'] = contentType || 'text/plain'; }
    else { b = JSON.stringify(body); headers['Content-Type'] = 'application/json'; }
  }
  const r = await fetch(path, { method, headers, body: b, credentials: 'same-origin', cache: 'no-store' });
  if (r.status === 401) { location.assign('/ui/login'); throw new APIError('logged out', 401); }
  const text = await r.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch { data = null; }
  if (!r.ok) throw new APIError((data && data.error) || text || r.statusText, r.status);
  return data;
}

export function csrf() { return session.csrf; }

function flash(msg, bad) {
  const f = document.getElementById('flash');
  f.replaceChildren(msg ? h('p', { class: bad ? 'error' : 'ok' }, msg) : '');
}

function app() { return document.getElementById('app'); }

function fmtTime(t) { return t ? new Date(t).toLocaleString() : ''; }
function fmtBytes(n) {
  if (!n) return '0';
  const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0; while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(n < 10 ? 1 : 0) : n) + ' ' + u[i];
}

// button runs fn, shows its error in the flash line, and re-renders.
function button(label, fn, attrs) {
  return h('button', Object.assign({ type: 'button', onclick: async (ev) => {
    const b = ev.currentTarget; b.disabled = true;
    try { await fn(); } catch (e) { flash(e.message, true); } finally { b.disabled = false; }
  } }, attrs || {}), label);
}

// ---- sandboxes

async function sandboxesPage() {
  const [list, images, runtimes] = await Promise.all([
    api('GET', '/v1/sandboxes'), api('GET', '/v1/images').catch(() => []), api('GET', '/v1/runtimes').catch(() => [])]);
  const rows = (list || []).map(s => h('tr', { 'data-id': s.id },
    h('td', h('a', { href: '#/sandboxes/' + encodeURIComponent(s.id) }, s.id)),
    session.admin ? h('td', s.tenant) : null,
    h('td', { class: 'status' }, s.status), h('td', s.runtime), h('td', s.class), h('td', s.image),
    h('td', { class: 'num' }, fmtBytes(s.resources.memory_bytes)), h('td', fmtTime(s.created_at))));
  const form = h('form', { class: 'inline', id: 'create-sandbox' },
    h('label', 'Image', h('select', { name: 'image' }, (images || []).map(i => h('option', { value: i.name }, i.name)))),
    h('label', 'Runtime', h('select', { name: 'runtime' }, h('option', { value: '' }, 'default'),
      (runtimes || []).filter(r => r.available).map(r => h('option', { value: r.name }, `${r.name} (${r.class})`)))),
    h('label', 'Memory (MiB)', h('input', { name: 'memory', type: 'number', min: '16', placeholder: 'default' })),
    h('label', 'Allow hosts', h('input', { name: 'allow', placeholder: 'api.example.com, *.pypi.org' })),
    h('button', { type: 'submit' }, 'Create sandbox'));
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    const f = new FormData(form);
    const req = { image: f.get('image') || undefined, runtime: f.get('runtime') || undefined };
    if (f.get('memory')) req.memory_bytes = Number(f.get('memory')) * 1024 * 1024;
    const allow = String(f.get('allow') || '').split(',').map(s => s.trim()).filter(Boolean);
    if (allow.length) req.allow = allow;
    try {
      const s = await api('POST', '/v1/sandboxes', req);
      location.hash = '#/sandboxes/' + encodeURIComponent(s.id);
    } catch (e) { flash(e.message, true); }
  });
  app().replaceChildren(h('h1', 'Sandboxes'),
    h('table', { id: 'sandboxes' }, h('thead', h('tr', h('th', 'ID'), session.admin ? h('th', 'Tenant') : null,
      h('th', 'Status'), h('th', 'Runtime'), h('th', 'Isolation'), h('th', 'Image'), h('th', 'Memory'), h('th', 'Created'))),
    h('tbody', rows)),
    rows.length ? null : h('p', { class: 'muted', id: 'no-sandboxes' }, 'No sandboxes.'),
    h('h2', 'New sandbox'), form);
}

async function sandboxPage(id) {
  const path = '/v1/sandboxes/' + encodeURIComponent(id);
  const s = await api('GET', path);
  const act = (verb) => async () => {
    await api('POST', path + '/' + verb, {});
    flash(`${verb}: done`);
    await route();
  };
  const r = s.resources || {};
  const secrets = (s.secrets || []).map(b => h('tr', h('td', b.name), h('td', b.secret), h('td', (b.hosts || []).join(', ')), h('td', b.mode)));
  const dl = h('dl', { class: 'kv', id: 'sandbox-detail' },
    h('dt', 'ID'), h('dd', s.id), h('dt', 'Tenant'), h('dd', s.tenant),
    h('dt', 'Status'), h('dd', { id: 'sandbox-status' }, s.status + (s.error ? ` (${s.error})` : '')),
    h('dt', 'Runtime'), h('dd', { id: 'sandbox-runtime' }, s.runtime),
    h('dt', 'Isolation class'), h('dd', { id: 'sandbox-class' }, s.class),
    h('dt', 'Image'), h('dd', s.image),
    h('dt', 'Memory'), h('dd', { id: 'sandbox-memory' }, fmtBytes(r.memory_bytes)),
    h('dt', 'CPUs'), h('dd', String(r.cpus || '')), h('dt', 'PIDs'), h('dd', String(r.pids || '')),
    h('dt', 'Disk'), h('dd', fmtBytes(r.disk_bytes)),
    h('dt', 'Created'), h('dd', fmtTime(s.created_at)), h('dt', 'Expires'), h('dd', s.expires_at ? fmtTime(s.expires_at) : 'never'),
    h('dt', 'Idle timeout'), h('dd', s.idle_timeout ? `${s.idle_timeout} (${s.idle_action || 'stop'})` : 'none'),
    s.network ? [h('dt', 'Address'), h('dd', `${s.network.address} via ${s.network.gateway} (${s.network.host_interface})`)] : null);
  const running = s.status === 'running';
  const actions = h('div', { class: 'actions' },
    button('Pause', act('pause'), { id: 'btn-pause', disabled: !running }),
    button('Resume', act('resume'), { id: 'btn-resume', disabled: s.status !== 'paused' }),
    button('Stop', act('stop'), { id: 'btn-stop', disabled: s.status === 'stopped' }),
    button('Remove', async () => { await api('DELETE', path); flash(`${id} removed`); location.hash = '#/sandboxes'; }, { id: 'btn-rm', class: 'danger' }),
    running ? h('a', { href: '#/terminal/' + encodeURIComponent(id), id: 'open-terminal' }, 'Open a terminal') : null);
  const editor = await policyEditor(path + '/policy', 'PUT');
  const log = eventLog({ sandbox: id });
  app().replaceChildren(h('h1', 'Sandbox ', h('code', s.id)), actions, dl,
    h('h2', 'Secrets bound'), secrets.length ? h('table', h('thead', h('tr', h('th', 'Name in guest'), h('th', 'Vault secret'), h('th', 'Hosts'), h('th', 'Mode'))), h('tbody', secrets)) : h('p', { class: 'muted' }, 'None.'),
    h('h2', 'Policy'), editor,
    h('h2', 'Egress log'), log);
}

// policyEditor edits a policy document at path (GET answers {policy,
// generation}; PUT takes the document). Validation errors from the
// daemon's 4xx are shown next to the editor.
async function policyEditor(path, method) {
  const cur = await api('GET', path);
  let gen = cur.generation;
  const ta = h('textarea', { id: 'policy-text', spellcheck: 'false', 'aria-label': 'policy document' });
  ta.value = JSON.stringify(cur.policy, null, 2);
  const msg = h('p', { id: 'policy-error', class: 'error', role: 'alert' });
  const info = h('p', { id: 'policy-info', class: 'muted' }, `generation ${gen}` + (cur.ref ? ` · follows named policy ${cur.ref}` : '') + (cur.frozen ? ' · FROZEN' : ''));
  const save = button('Save policy', async () => {
    msg.textContent = '';
    try {
      const out = await api(method, path, ta.value, 'application/json');
      gen = out.generation;
      ta.value = JSON.stringify(out.policy, null, 2);
      info.textContent = `saved: generation ${gen}`;
      info.className = 'ok';
    } catch (e) {
      if (e.status >= 400 && e.status < 500) { msg.textContent = e.message; info.className = 'muted'; return; }
      throw e;
    }
  }, { id: 'policy-save' });
  return h('div', { class: 'policy-editor' }, info, ta, h('div', { class: 'actions' }, save), msg);
}

// ---- events

const verdictOf = (e) => (e.data && e.data.verdict) ||
  ({ 'egress.allow': 'allow', 'egress.deny': 'deny', 'approval.pending': 'hold' })[e.kind] ||
  (e.kind === 'approval.decided' && e.data ? ({ allowed: 'allow', denied: 'deny' })[e.data.state] || '' : '');

function eventRow(e) {
  const d = e.data || {};
  const alert = e.kind.startsWith('secret.') && /alert|exfil|reflected|refused/.test(e.kind);
  const detail = [];
  if (d.method || d.path) detail.push(`${d.method || ''} ${d.path || ''}`.trim());
  if (d.reason) detail.push(d.reason);
  if (d.name && !d.host) detail.push(d.name);
  if (d.secret) detail.push('secret ' + d.secret);
  if (d.status) detail.push('HTTP ' + d.status);
  const host = d.host ? d.host + (d.port ? ':' + d.port : '') : '';
  const v = verdictOf(e);
  return h('tr', { 'data-seq': e.seq, 'data-kind': e.kind, class: alert ? 'alert' : '' },
    h('td', fmtTime(e.time)), session.admin ? h('td', e.tenant) : null, h('td', e.sandbox || ''),
    h('td', e.kind), h('td', { class: v ? 'verdict-' + v : '' }, v), h('td', host), h('td', d.rule || ''),
    h('td', { class: 'num' }, d.bytes_up || d.bytes_down ? `${fmtBytes(d.bytes_up)} ↑ ${fmtBytes(d.bytes_down)} ↓` : ''),
    h('td', detail.join(' · ')));
}

// eventLog shows events (of one sandbox, or the tenant's) live: the
// events API streams NDJSON with follow=1; a dropped stream resumes after
// the last sequence number seen.
function eventLog(opts) {
  const tbody = h('tbody');
  const status = h('p', { class: 'muted event-status' }, 'connecting…');
  const kindSel = h('select', { class: 'event-kind' }, h('option', { value: 'egress.|secret.|approval.|policy.' }, 'egress, secrets, approvals, policy'),
    h('option', { value: 'egress.' }, 'egress only'), h('option', { value: 'secret.' }, 'secret alerts and use'), h('option', { value: '' }, 'everything'));
  const tenantIn = session.admin && !opts.sandbox ? h('input', { class: 'event-tenant', placeholder: 'tenant (all)' }) : null;
  const shown = (e) => {
    const ks = kindSel.value ? kindSel.value.split('|') : [];
    if (ks.length && !ks.some(k => e.kind.startsWith(k))) return false;
    if (tenantIn && tenantIn.value.trim() && e.tenant !== tenantIn.value.trim()) return false;
    return true;
  };
  const all = [];
  const redraw = () => { tbody.replaceChildren(...all.filter(shown).slice(-500).reverse().map(eventRow)); };
  kindSel.addEventListener('change', redraw);
  if (tenantIn) tenantIn.addEventListener('input', redraw);
  const ac = new AbortController();
  cleanup.push(() => ac.abort());
  let after = 0;
  (async () => {
    while (!ac.signal.aborted) {
      try {
        const q = new URLSearchParams({ follow: '1' });
        if (opts.sandbox) q.set('sandbox', opts.sandbox);
        if (after) q.set('after', String(after));
        const r = await fetch('/v1/events?' + q, { signal: ac.signal, credentials: 'same-origin', cache: 'no-store' });
        if (r.status === 401) { location.assign('/ui/login'); return; }
        if (!r.ok) { status.textContent = 'events: ' + ((await r.json().catch(() => ({}))).error || r.statusText); return; }
        status.textContent = 'live';
        const rd = r.body.getReader();
        const dec = new TextDecoder();
        let buf = '';
        for (;;) {
          const { value, done } = await rd.read();
          if (done) break;
          buf += dec.decode(value, { stream: true });
          let i; let added = false;
          while ((i = buf.indexOf('\n')) >= 0) {
            const line = buf.slice(0, i); buf = buf.slice(i + 1);
            if (!line.trim()) continue;
            const e = JSON.parse(line);
            if (e.seq > after) { after = e.seq; all.push(e); added = true; }
          }
          if (all.length > 2000) all.splice(0, all.length - 2000);
          if (added) redraw();
        }
        status.textContent = 'reconnecting…';
      } catch (e) {
        if (ac.signal.aborted) return;
        status.textContent = 'reconnecting… (' + e.message + ')';
      }
      await new Promise(res => setTimeout(res, 1000));
    }
  })();
  return h('div', { class: 'event-log' }, h('div', { class: 'inline' }, kindSel, ' ', tenantIn, ' ', status),
    h('table', { class: 'events' }, h('thead', h('tr', h('th', 'Time'), session.admin ? h('th', 'Tenant') : null, h('th', 'Sandbox'),
      h('th', 'Kind'), h('th', 'Verdict'), h('th', 'Host'), h('th', 'Rule'), h('th', 'Bytes'), h('th', 'Detail'))), tbody));
}

async function eventsPage() {
  app().replaceChildren(h('h1', session.admin ? 'Egress log (every tenant)' : `Egress log (tenant ${session.tenant})`), eventLog({}));
}

// ---- secrets

async function secretsPage() {
  const list = await api('GET', '/v1/secrets');
  const rows = (list || []).map(s => {
    const p = '/v1/secrets/' + encodeURIComponent(s.name);
    const rot = h('input', { type: 'password', class: 'rotate-value', placeholder: 'new value', autocomplete: 'off', 'aria-label': 'new value for ' + s.name });
    return h('tr', { 'data-name': s.name },
      h('td', s.name), session.admin ? h('td', s.tenant) : null, h('td', (s.hosts || []).join(', ')), h('td', h('code', { class: 'preview' }, s.preview)),
      h('td', { class: 'num' }, String(s.version)), h('td', s.revoked_at ? h('span', { class: 'state-denied' }, 'revoked ' + fmtTime(s.revoked_at)) : 'active'),
      h('td', h('div', { class: 'actions' }, rot,
        button('Rotate', async () => {
          const v = rot.value; rot.value = '';
          if (!v) throw new Error('type the new value first');
          await api('PUT', p, { value: v });
          flash(`${s.name} rotated`); await route();
        }, { class: 'btn-rotate' }),
        s.revoked_at ? null : button('Revoke', async () => { await api('POST', p + '/revoke', {}); flash(`${s.name} revoked`); await route(); }, { class: 'btn-revoke danger' }),
        button('Delete', async () => { await api('DELETE', p); flash(`${s.name} deleted`); await route(); }, { class: 'btn-delete danger' }))));
  });
  const form = h('form', { class: 'inline', id: 'add-secret', autocomplete: 'off' },
    h('label', 'Name', h('input', { name: 'name', required: true, placeholder: 'GITHUB_TOKEN' })),
    h('label', 'Value', h('input', { name: 'value', type: 'password', required: true, autocomplete: 'off' })),
    h('label', 'Hosts it may be sent to', h('input', { name: 'hosts', required: true, placeholder: 'api.github.com' })),
    h('button', { type: 'submit' }, 'Add secret'));
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    const f = new FormData(form);
    const req = { name: String(f.get('name')).trim(), value: String(f.get('value')),
      hosts: String(f.get('hosts')).split(',').map(x => x.trim()).filter(Boolean) };
    form.elements.value.value = ''; // the value never stays in the page
    try { await api('POST', '/v1/secrets', req); flash(`${req.name} added`); await route(); } catch (e) { flash(e.message, true); }
  });
  app().replaceChildren(h('h1', 'Secrets'),
    h('p', { class: 'muted' }, 'Values are never shown: only the last characters (preview) and the hosts each secret may be sent to.'),
    h('table', { id: 'secrets' }, h('thead', h('tr', h('th', 'Name'), session.admin ? h('th', 'Tenant') : null, h('th', 'Hosts'), h('th', 'Preview'),
      h('th', 'Version'), h('th', 'State'), h('th', ''))), h('tbody', rows)),
    h('h2', 'Add a secret'), form);
}

// ---- policies (named)

async function policiesPage(name) {
  if (name) {
    const p = '/v1/policies/' + encodeURIComponent(name);
    app().replaceChildren(h('h1', 'Named policy ', h('code', name)), await policyEditor(p, 'PUT'),
      h('div', { class: 'actions' }, button('Delete policy', async () => { await api('DELETE', p); location.hash = '#/policies'; }, { class: 'danger' })));
    return;
  }
  const list = await api('GET', '/v1/policies');
  const form = h('form', { class: 'inline', id: 'new-policy' },
    h('label', 'Name', h('input', { name: 'name', required: true })), h('button', { type: 'submit' }, 'Create'));
  const err = h('p', { class: 'error', id: 'new-policy-error' });
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    const name = String(new FormData(form).get('name')).trim();
    try {
      await api('POST', '/v1/policies', { name, policy: { version: 1, default: 'deny', rules: [] } });
      location.hash = '#/policies/' + encodeURIComponent(name);
    } catch (e) { err.textContent = e.message; }
  });
  app().replaceChildren(h('h1', 'Named policies'),
    h('p', { class: 'muted' }, "A sandbox's own policy is edited on its page."),
    h('table', h('thead', h('tr', h('th', 'Name'), h('th', 'Generation'), h('th', 'Updated'))),
      h('tbody', (list || []).map(p => h('tr', h('td', h('a', { href: '#/policies/' + encodeURIComponent(p.name) }, p.name)),
        h('td', { class: 'num' }, String(p.generation)), h('td', fmtTime(p.updated_at)))))),
    h('h2', 'New named policy'), form, err);
}

// ---- approvals

async function approvalsPage() {
  const list = await api('GET', '/v1/approvals?state=pending');
  const decide = (id, decision) => async () => {
    await api('POST', '/v1/approvals/' + encodeURIComponent(id), { decision });
    flash(`${id}: ${decision}`); await route();
  };
  const rows = (list || []).map(a => h('tr', { 'data-id': a.id },
    h('td', a.id), h('td', a.sandbox), h('td', a.rule), h('td', h('code', JSON.stringify(a.request))),
    h('td', fmtTime(a.deadline)),
    h('td', h('div', { class: 'actions' }, button('Approve', decide(a.id, 'allow'), { class: 'btn-approve' }),
      button('Deny', decide(a.id, 'deny'), { class: 'btn-deny danger' })))));
  app().replaceChildren(h('h1', 'Approvals waiting'),
    h('div', { class: 'actions' }, button('Refresh', route, { id: 'approvals-refresh' })),
    rows.length ? h('table', { id: 'approvals' }, h('thead', h('tr', h('th', 'ID'), h('th', 'Sandbox'), h('th', 'Rule'), h('th', 'Request'),
      h('th', 'Deadline'), h('th', ''))), h('tbody', rows)) : h('p', { class: 'muted', id: 'no-approvals' }, 'Nothing is waiting for a decision.'));
  // The queue refreshes itself while shown.
  const t = setInterval(() => { if (!document.querySelector('#approvals button:disabled')) route(); }, 5000);
  cleanup.push(() => clearInterval(t));
}

// ---- tools

async function toolsPage() {
  const list = await api('GET', '/v1/tools');
  app().replaceChildren(h('h1', 'Tools'),
    h('table', { id: 'tools' }, h('thead', h('tr', h('th', 'Name'), h('th', 'Description'), h('th', 'Command'), h('th', 'Image'), h('th', 'Allow'))),
      h('tbody', (list || []).map(t => h('tr', h('td', t.name), h('td', t.description || ''), h('td', h('code', (t.argv || []).join(' '))),
        h('td', t.image || ''), h('td', (t.allow || []).join(', ') || t.policy_ref || ''))))),
    (list || []).length ? null : h('p', { class: 'muted' }, 'No tools: cagebox tool add registers one.'));
}

// ---- tenants and keys (admin)

async function tenantsPage() {
  if (!session.admin) { app().replaceChildren(h('p', { class: 'error' }, 'Tenants are for the admin only.')); return; }
  const list = await api('GET', '/v1/tenants');
  const once = h('div', { id: 'new-key' });
  const rows = (list || []).map(t => h('tr', { 'data-id': t.id },
    h('td', t.id), h('td', t.name), h('td', t.floor || t.min_isolation || ''), h('td', t.untrusted ? 'yes' : ''), h('td', fmtTime(t.created_at)),
    h('td', button('New API key', async () => {
      const k = await api('POST', '/v1/tenants/' + encodeURIComponent(t.id) + '/keys');
      const code = h('code', { id: 'new-key-value' }, k.key);
      const copy = button('Copy', async () => { await navigator.clipboard.writeText(k.key); copy.textContent = 'Copied'; }, { id: 'copy-key' });
      once.replaceChildren(h('div', { class: 'once' }, h('p', `New key for ${t.id} (${k.prefix}…): it is shown this once and never again.`), code, ' ', copy,
        ' ', button('Done', async () => { once.replaceChildren(); }, { id: 'key-done' })));
    }, { class: 'btn-key' }))));
  const form = h('form', { class: 'inline', id: 'new-tenant' },
    h('label', 'Name', h('input', { name: 'name', required: true })),
    h('label', 'Isolation floor', h('select', { name: 'min' }, ['', 'namespaces', 'app-kernel', 'hypervisor'].map(c => h('option', { value: c }, c || 'default')))),
    h('label', 'Untrusted', h('input', { name: 'untrusted', type: 'checkbox' })), h('button', { type: 'submit' }, 'Create tenant'));
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    const f = new FormData(form);
    try {
      await api('POST', '/v1/tenants', { name: String(f.get('name')).trim(), min_isolation: f.get('min') || undefined, untrusted: f.get('untrusted') === 'on' });
      await route();
    } catch (e) { flash(e.message, true); }
  });
  app().replaceChildren(h('h1', 'Tenants'), once,
    h('table', { id: 'tenants' }, h('thead', h('tr', h('th', 'ID'), h('th', 'Name'), h('th', 'Isolation floor'), h('th', 'Untrusted'), h('th', 'Created'), h('th', ''))),
      h('tbody', rows)), h('h2', 'New tenant'), form);
}

// ---- terminal

async function terminalPage(id) {
  const s = await api('GET', '/v1/sandboxes/' + encodeURIComponent(id));
  const box = h('div', { id: 'terminal' });
  const status = h('p', { class: 'term-status', id: 'term-status' }, 'connecting…');
  app().replaceChildren(h('h1', 'Terminal in ', h('a', { href: '#/sandboxes/' + encodeURIComponent(id) }, h('code', s.id))), status, box);
  cleanup.push(openTerminal(box, status, id, session.csrf));
}

// ---- router

const routes = [
  [/^#\/sandboxes\/([^/]+)$/, sandboxPage],
  [/^#\/terminal\/([^/]+)$/, terminalPage],
  [/^#\/sandboxes$/, sandboxesPage],
  [/^#\/events$/, eventsPage],
  [/^#\/secrets$/, secretsPage],
  [/^#\/policies\/([^/]+)$/, policiesPage],
  [/^#\/policies$/, policiesPage],
  [/^#\/approvals$/, approvalsPage],
  [/^#\/tools$/, toolsPage],
  [/^#\/tenants$/, tenantsPage],
];

let routing = 0;
async function route() {
  const my = ++routing;
  for (const f of cleanup.splice(0)) { try { f(); } catch { /* already gone */ } }
  const hash = location.hash || '#/sandboxes';
  for (const a of document.querySelectorAll('#nav a')) a.classList.toggle('active', hash.startsWith(a.getAttribute('href')));
  for (const [re, page] of routes) {
    const m = hash.match(re);
    if (!m) continue;
    try {
      await page(...m.slice(1).map(decodeURIComponent));
    } catch (e) {
      if (my === routing) app().replaceChildren(h('p', { class: 'error', id: 'page-error' }, e.message));
    }
    return;
  }
  location.hash = '#/sandboxes';
}

async function main() {
  const r = await fetch('/ui/session', { credentials: 'same-origin', cache: 'no-store' });
  if (!r.ok) { location.assign('/ui/login'); return; }
  session = await r.json();
  document.getElementById('who').textContent = session.admin ? 'admin' : 'tenant ' + session.tenant;
  document.getElementById('nav-tenants').hidden = !session.admin;
  document.getElementById('logout-csrf').value = session.csrf;
  window.addEventListener('hashchange', () => { flash(''); route(); });
  await route();
  document.body.dataset.ready = '1';
}

main();

// The terminal page: xterm.js (vendored) over the daemon's pty WebSocket,
// GET /v1/sandboxes/{id}/pty: binary messages both ways are terminal
// bytes; the client sends {"type":"resize","rows":N,"cols":M} as text; the
// server ends with {"type":"exit","exit_code":N,"signal":"SIGX"}. A
// WebSocket cannot carry headers, so the session's CSRF token goes in the
// query (?csrf=), which the daemon accepts for upgrades only.
import { Terminal } from './vendor/xterm.mjs';

// xterm.js injects <style> elements (theme, cell size). The console's CSP
// allows no inline style, so the browser would refuse them. This shim
// (hand-written: xterm has no option for it) gives xterm a stand-in element
// whose textContent becomes a constructed style sheet adopted by the
// document, which the CSP permits, and which goes away when xterm removes
// the element. xterm makes them at any time (render frames, resizes), so
// the shim stays in place for the page's life; the console itself never
// makes a <style>.
{
  const orig = Document.prototype.createElement;
  Document.prototype.createElement = function (tag, opts) {
    if (String(tag).toLowerCase() !== 'style') return orig.call(this, tag, opts);
    const doc = this;
    const el = orig.call(doc, 'cbx-style');
    const sheet = new CSSStyleSheet();
    doc.adoptedStyleSheets = [...doc.adoptedStyleSheets, sheet];
    Object.defineProperty(el, 'textContent', {
      get() { return Array.from(sheet.cssRules, r => r.cssText).join('\n'); },
      set(v) { sheet.replaceSync(String(v)); },
    });
    const remove = el.remove.bind(el);
    el.remove = () => { doc.adoptedStyleSheets = doc.adoptedStyleSheets.filter(s => s !== sheet); remove(); };
    return el;
  };
}

// openTerminal opens a terminal in box for sandbox id and returns the
// function that closes it.
export function openTerminal(box, status, id, csrf) {
  const term = new Terminal({ cursorBlink: true, fontSize: 14, scrollback: 5000, convertEol: false });
  term.open(box);
  const fit = () => {
    const cell = box.querySelector('.xterm-rows > div');
    const h = cell ? cell.getBoundingClientRect().height : 17;
    const w = h * 0.6;
    const cols = Math.max(20, Math.floor((box.clientWidth - 8) / w));
    const rows = Math.max(5, Math.floor((box.clientHeight - 8) / h));
    if (cols !== term.cols || rows !== term.rows) term.resize(cols, rows);
  };
  fit();
  const q = new URLSearchParams({ rows: String(term.rows), cols: String(term.cols), csrf });
  const proto = location.protocol === 'https:' ? 'wss:' : 'ws:';
  const ws = new WebSocket(`${proto}//${location.host}/v1/sandboxes/${encodeURIComponent(id)}/pty?${q}`);
  ws.binaryType = 'arraybuffer';
  const enc = new TextEncoder();
  let exited = false;
  ws.onopen = () => { status.textContent = 'connected'; status.dataset.state = 'open'; term.focus(); };
  ws.onmessage = (ev) => {
    if (typeof ev.data === 'string') {
      let m; try { m = JSON.parse(ev.data); } catch { return; }
      if (m.type === 'exit') {
        exited = true;
        status.textContent = `exited: code ${m.exit_code}` + (m.signal ? ` (${m.signal})` : '');
        status.dataset.state = 'exited';
      }
      return;
    }
    term.write(new Uint8Array(ev.data));
  };
  ws.onclose = (ev) => {
    if (!exited) { status.textContent = 'disconnected' + (ev.reason ? ': ' + ev.reason : ` (code ${ev.code})`); status.dataset.state = 'closed'; }
  };
  const input = term.onData((d) => { if (ws.readyState === WebSocket.OPEN) ws.send(enc.encode(d)); });
  const resized = term.onResize(({ rows, cols }) => {
    if (ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify({ type: 'resize', rows, cols }));
    box.dataset.rows = String(rows); box.dataset.cols = String(cols);
  });
  box.dataset.rows = String(term.rows); box.dataset.cols = String(term.cols);
  const ro = new ResizeObserver(() => fit());
  ro.observe(box);
  // Tests (and people) can resize explicitly.
  box.addEventListener('cbx-resize', (ev) => term.resize(ev.detail.cols, ev.detail.rows));
  return () => { ro.disconnect(); input.dispose(); resized.dispose(); try { ws.close(1000); } catch { /* closed */ } term.dispose(); };
}

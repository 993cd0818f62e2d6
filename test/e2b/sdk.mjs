// Drives a cagebox daemon's E2B front with the official E2B SDK, unchanged.
// The environment is the SDK's own (E2B_API_URL, E2B_SANDBOX_URL,
// E2B_API_KEY) plus OTHER_ID (a sandbox of another tenant) and RUN (a
// unique metadata value). It prints one JSON report: {checks: [{name, ok,
// detail}], fatal}; test/e2e/e2b_test.go fails on any check that is not ok.
// Every sandbox it makes, it kills (also on failure).
import { createHash, randomBytes } from 'node:crypto'
import http from 'node:http'
// SECRET_REAL is the value of the tenant's secret E2B_TEST_TOKEN (it must
// never be seen inside); the daemon resolves api.example.test,
// other.example.test and third.example.test to one HTTPS stand-in upstream
// that answers 403 to any Authorization but "Bearer SECRET_REAL" (so a 200
// with it means the real value arrived). The tenant's secret is bound to
// api.example.test only. E2B_MODULE picks the SDK line: "e2b" (2.51.0) or "e2b-2.45" (2.45.0).
const {
  Sandbox,
  CommandExitError,
  AuthenticationError,
  NotFoundError,
  SandboxNotFoundError,
  SandboxError,
} = await import(process.env.E2B_MODULE || 'e2b')

const checks = []
const check = (name, ok, detail) => checks.push({ name, ok: !!ok, detail: detail === undefined ? '' : String(detail) })
const errName = (e) => (e && e.constructor ? e.constructor.name : typeof e) + ': ' + (e && e.message)

async function expectError(name, fn, cls) {
  try {
    const v = await fn()
    check(name, false, 'no error; returned ' + JSON.stringify(v))
    return undefined
  } catch (e) {
    check(name, e instanceof cls, errName(e))
    return e
  }
}

const sha = (b) => createHash('sha256').update(b).digest('hex')

let sbx, second
let report = { checks }
try {
  // Wrong key: the SDK's AuthenticationError, nothing made.
  await expectError('wrong API key → AuthenticationError',
    () => Sandbox.create({ apiKey: 'e2b_' + '0'.repeat(64) }), AuthenticationError)

  // Network entries cagebox cannot express (IPs, CIDRs), or names where
  // E2B takes addresses: a 400 with a message, nothing made (the metadata
  // filter below finds only the sandboxes that were made).
  for (const [what, network] of [
    ['allowOut IP', { allowOut: ['1.1.1.1'] }],
    ['allowOut CIDR', { allowOut: ['8.8.8.0/24'] }],
    ['allowOut all traffic', { allowOut: ({ allTraffic }) => [allTraffic] }],
    ['denyOut name', { denyOut: ['example.com'] }],
  ]) {
    const e = await expectError(`network ${what} → SandboxError 400`,
      () => Sandbox.create({ metadata: { run: process.env.RUN }, network }), SandboxError)
    check(`network ${what}: the 400 says why`, e && /^400: .*(allowOut|denyOut)/.test(e.message), e && e.message)
  }

  // allowOut opens exactly its hosts; denyOut all traffic is E2B's "deny the rest".
  sbx = await Sandbox.create({
    timeoutMs: 300_000, metadata: { suite: 'e2b-e2e', run: process.env.RUN }, envs: { GREETING: 'hello-env', TOKEN: 'vault:E2B_TEST_TOKEN' },
    network: { allowOut: ['api.example.test', 'other.example.test'], denyOut: ({ allTraffic }) => [allTraffic] },
  })
  check('Sandbox.create gives an id of lowercase alphanumerics', /^[a-z0-9]+$/.test(sbx.sandboxId), sbx.sandboxId)
  check('isRunning after create', await sbx.isRunning())

  const r = await sbx.commands.run('echo out; echo err >&2; echo "$GREETING"')
  check('commands.run stdout', r.stdout === 'out\nhello-env\n', JSON.stringify(r.stdout))
  check('commands.run stderr', r.stderr === 'err\n', JSON.stringify(r.stderr))
  check('commands.run exitCode 0', r.exitCode === 0, r.exitCode)

  // A vault: envVars value is a placeholder inside; the real value is
  // nowhere in the guest's environment.
  const tok = (await sbx.commands.run('printf %s "$TOKEN"')).stdout
  const env = (await sbx.commands.run('cat /proc/1/environ /proc/self/environ | tr "\\0" "\\n"')).stdout
  check('envVars vault: secret is a placeholder in the guest', tok.length > 8 && tok !== process.env.SECRET_REAL && !env.includes(process.env.SECRET_REAL), tok)

  const ee = await expectError('exit 3 → CommandExitError', () => sbx.commands.run('echo partial; exit 3'), CommandExitError)
  check('CommandExitError carries exit code and output', ee && ee.exitCode === 3 && ee.stdout === 'partial\n', ee && JSON.stringify({ exitCode: ee.exitCode, stdout: ee.stdout }))

  // A background command streaming through onStdout.
  const chunks = []
  const bg = await sbx.commands.run('for i in 1 2 3; do echo tick$i; sleep 0.1; done', { background: true, onStdout: (d) => chunks.push(d) })
  check('background command has a pid', typeof bg.pid === 'number' && bg.pid > 0, bg.pid)
  const bgr = await bg.wait()
  check('onStdout streamed the output', chunks.join('') === 'tick1\ntick2\ntick3\n' && bgr.exitCode === 0, JSON.stringify(chunks))

  // stdin: sendStdin, then closeStdin ends cat.
  const cat = await sbx.commands.run('cat', { background: true, stdin: true })
  await sbx.commands.sendStdin(cat.pid, 'typed in\n')
  await sbx.commands.closeStdin(cat.pid)
  const catr = await cat.wait()
  check('sendStdin + closeStdin', catr.stdout === 'typed in\n', JSON.stringify(catr.stdout))

  // list and kill a running command.
  const sleeper = await sbx.commands.run('sleep 600', { background: true })
  const procs = await sbx.commands.list()
  check('commands.list shows the running command', procs.some((p) => p.pid === sleeper.pid), JSON.stringify(procs))
  check('commands.kill', await sbx.commands.kill(sleeper.pid) === true)
  const ke = await expectError('a killed command ends with CommandExitError', () => sleeper.wait(), CommandExitError)
  check('killed command exit code', ke && ke.exitCode !== 0, ke && ke.exitCode)
  check('commands.kill of an ended command is false', await sbx.commands.kill(sleeper.pid) === false)

  // Files.
  const w = await sbx.files.write('/tmp/e2b/a.txt', 'hello files')
  check('files.write answers the entry', w.path === '/tmp/e2b/a.txt' && w.name === 'a.txt', JSON.stringify(w))
  check('files.read', await sbx.files.read('/tmp/e2b/a.txt') === 'hello files')
  const ls = await sbx.files.list('/tmp/e2b')
  check('files.list', ls.length === 1 && ls[0].name === 'a.txt' && ls[0].type === 'file' && ls[0].size === 11, JSON.stringify(ls))
  check('files.makeDir', await sbx.files.makeDir('/tmp/e2b/d') === true)
  check('files.makeDir of an existing directory is false', await sbx.files.makeDir('/tmp/e2b/d') === false)
  const mv = await sbx.files.rename('/tmp/e2b/a.txt', '/tmp/e2b/d/b.txt')
  check('files.rename', mv.path === '/tmp/e2b/d/b.txt', JSON.stringify(mv))
  check('files.exists of the new path', await sbx.files.exists('/tmp/e2b/d/b.txt') === true)
  check('files.exists of the old path is false', await sbx.files.exists('/tmp/e2b/a.txt') === false)
  const info = await sbx.files.getInfo('/tmp/e2b/d')
  check('files.getInfo of a directory', info.type === 'dir' && info.name === 'd', JSON.stringify(info))
  const deep = await sbx.files.list('/tmp/e2b', { depth: 2 })
  check('files.list depth 2', deep.map((e) => e.path).sort().join(',') === '/tmp/e2b/d,/tmp/e2b/d/b.txt', JSON.stringify(deep.map((e) => e.path)))
  await sbx.files.remove('/tmp/e2b/d')
  check('files.remove', await sbx.files.exists('/tmp/e2b/d') === false)
  await expectError('files.read of a missing file → NotFoundError', () => sbx.files.read('/tmp/e2b/nope'), NotFoundError)
  // 20 MiB of binary, both ways.
  const big = randomBytes(20 << 20)
  await sbx.files.write('/tmp/big.bin', big)
  const back = await sbx.files.read('/tmp/big.bin', { format: 'bytes' })
  check('20 MiB binary round trip', back.length === big.length && sha(back) === sha(big), back.length)
  const inGuest = await sbx.commands.run('sha256sum /tmp/big.bin')
  check('20 MiB binary as written in the guest', inGuest.stdout.startsWith(sha(big)), inGuest.stdout)
  // Several files in one multipart upload.
  await sbx.files.write([{ path: '/tmp/m/one.txt', data: '1' }, { path: '/tmp/m/two.txt', data: '22' }])
  check('files.write of several files', (await sbx.commands.run('cat /tmp/m/one.txt /tmp/m/two.txt')).stdout === '122')

  // watchDir: events arrive as files change (waited for, not slept on).
  await sbx.files.makeDir('/tmp/w')
  const seen = []
  let onCreate, onRemove
  const created = new Promise((res) => { onCreate = res })
  const removed = new Promise((res) => { onRemove = res })
  const watch = await sbx.files.watchDir('/tmp/w', (ev) => {
    seen.push(ev.type + ' ' + ev.name)
    if (ev.type === 'create' && ev.name === 'x.txt') onCreate()
    if (ev.type === 'remove' && ev.name === 'x.txt') onRemove()
  })
  await sbx.files.write('/tmp/w/x.txt', 'watched')
  await created
  await sbx.files.remove('/tmp/w/x.txt')
  await removed
  await watch.stop()
  check('files.watchDir: create and remove events', seen.includes('create x.txt') && seen.includes('remove x.txt'), JSON.stringify(seen))

  // A terminal: input, resize, output.
  let ptyOut = ''
  const term = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => { ptyOut += new TextDecoder().decode(d) } })
  await sbx.pty.resize(term.pid, { cols: 100, rows: 30 })
  await sbx.pty.sendInput(term.pid, new TextEncoder().encode('stty size; echo pty-$((40+2)); exit\n'))
  await term.wait().catch(() => {})
  check('pty: input typed, output read, resized', ptyOut.includes('pty-42') && ptyOut.includes('30 100'), JSON.stringify(ptyOut.slice(-300)))

  // Egress stays deny-by-default: only allowOut's hosts are open.
  const curl = await sbx.commands.run('curl -sS -m 20 -o /dev/null https://example.com/; echo "exit=$?"')
  check('curl to an unallowed host is refused', /exit=[1-9]/.test(curl.stdout), curl.stdout + curl.stderr)
  const get = (host, auth) => sbx.commands.run(`curl -sS -m 20 ${auth ? '-H "Authorization: Bearer $TOKEN" ' : ''}-w '\\n%{http_code}' https://${host}/e2b; echo " exit=$?"`)
  const hello = (r, host) => r.stdout.startsWith(`hello from upstream ${host} /e2b`) && r.stdout.endsWith('\n200 exit=0\n')
  // Refused: a name no rule allows has no address (the synthetic DNS
  // answers NXDOMAIN: curl exit 6), or the gateway's 403.
  const denied = (r) => / exit=6\n$/.test(r.stdout) || (r.stdout.endsWith('\n403 exit=0\n') && r.stdout.includes('denied by cagebox'))
  const out = (r) => JSON.stringify({ stdout: r.stdout, stderr: r.stderr })
  const netInfo = async () => JSON.stringify((await Sandbox.getInfo(sbx.sandboxId)).network)
  let ni = await netInfo()
  check('getInfo reports the network', ni === JSON.stringify({ allowOut: ['api.example.test', 'other.example.test'], denyOut: ['0.0.0.0/0'], allowPublicTraffic: false }), ni)
  let g = await get('other.example.test')
  check('network.allowOut: a listed host is reachable', hello(g, 'other.example.test'), out(g))
  g = await get('third.example.test')
  check('network.allowOut: an unlisted host is refused by the gateway', denied(g), out(g))

  // The vault: secret's placeholder becomes the real value toward its
  // bound host only (the upstream accepts nothing else).
  g = await get('api.example.test', true)
  check('envVars vault: the bound host receives the real value', hello(g, 'api.example.test'), out(g))
  g = await get('other.example.test', true)
  check('envVars vault: the placeholder to another allowed host is refused, never the real value',
    !g.stdout.includes('hello from upstream') && !g.stdout.includes(process.env.SECRET_REAL) && /\n4\d\d exit=0\n$/.test(g.stdout), out(g))

  // updateNetwork replaces the live rules at once.
  await sbx.updateNetwork({ allowOut: ['third.example.test'] })
  g = await get('third.example.test')
  check('updateNetwork: a newly listed host is reachable', hello(g, 'third.example.test'), out(g))
  g = await get('other.example.test')
  check('updateNetwork: a host no longer listed is refused', denied(g), out(g))
  ni = await netInfo()
  check('getInfo reports the new network', ni.startsWith(JSON.stringify({ allowOut: ['third.example.test'] }).slice(0, -1) + ','), ni)
  await expectError('updateNetwork with a CIDR → SandboxError', () => sbx.updateNetwork({ allowOut: ['10.0.0.0/8'] }), SandboxError)
  g = await get('third.example.test')
  check('a refused updateNetwork changes nothing', hello(g, 'third.example.test'), out(g))
  await sbx.updateNetwork({})
  g = await get('third.example.test')
  check('updateNetwork without allowOut: nothing open', denied(g), out(g))

  // A guest port through getHost(port): PORT-ID.DOMAIN on the front's
  // listener (E2B_API_URL; the name is sent as Host: no wildcard DNS
  // here), on through cagebox's ingress; the sandbox's trafficAccessToken
  // opens it (it was not created public).
  const serve = async (s, body) => {
    await s.files.write('/tmp/www/index.html', body)
    let onReady
    const ready = new Promise((res) => { onReady = res })
    await s.commands.run(`python3 -c "import http.server, os; os.chdir('/tmp/www'); s = http.server.ThreadingHTTPServer(('0.0.0.0', 8000), http.server.SimpleHTTPRequestHandler); print('ready', flush=True); s.serve_forever()"`,
      { background: true, onStdout: (d) => { if (d.includes('ready')) onReady() } })
    await ready
  }
  const fetchHost = (host, headers = {}) => new Promise((resolve, reject) => {
    const u = new URL(process.env.E2B_API_URL)
    http.get({ host: u.hostname, port: u.port, path: '/index.html', headers: { Host: host, ...headers } }, (res) => {
      let body = ''
      res.on('data', (c) => { body += c })
      res.on('end', () => resolve({ status: res.statusCode, body }))
    }).on('error', reject)
  })
  await serve(sbx, 'hello from the guest port')
  const gh = sbx.getHost(8000)
  check('getHost(8000) is 8000-ID.DOMAIN', gh === `8000-${sbx.sandboxId}.${process.env.E2B_DOMAIN_WANT}`, gh)
  check('a sandbox not created public has a trafficAccessToken', typeof sbx.trafficAccessToken === 'string' && sbx.trafficAccessToken.length > 16, sbx.trafficAccessToken)
  let f = await fetchHost(gh)
  check('getHost without the traffic token → 403 (as E2B)', f.status === 403, JSON.stringify(f))
  f = await fetchHost(gh, { 'e2b-traffic-access-token': 'ta_' + '0'.repeat(64) })
  check('getHost with a wrong traffic token → 403', f.status === 403, JSON.stringify(f))
  f = await fetchHost(gh, { 'e2b-traffic-access-token': sbx.trafficAccessToken })
  check('getHost with the traffic token reaches the guest server', f.status === 200 && f.body === 'hello from the guest port', JSON.stringify(f))
  f = await fetchHost(gh, { 'e2b-traffic-access-token': sbx.trafficAccessToken })
  check('getHost again (the port stays published)', f.status === 200 && f.body === 'hello from the guest port', JSON.stringify(f))
  f = await fetchHost(sbx.getHost(8001), { 'e2b-traffic-access-token': sbx.trafficAccessToken })
  check('getHost of a port nothing listens on → 502', f.status === 502, JSON.stringify(f))

  // A template IMAGE:RUNTIME runs on that runtime (the Go test checks
  // which); getInfo gives the template back as asked.
  if (process.env.ALT_RUNTIME) {
    const tmpl = `base:${process.env.ALT_RUNTIME}`
    const alt = await Sandbox.create(tmpl, { timeoutMs: 120_000 })
    report.alt = alt.sandboxId
    try {
      check(`template ${tmpl}: commands.run`, (await alt.commands.run('echo alt')).stdout === 'alt\n')
      const ai = await Sandbox.getInfo(alt.sandboxId)
      check(`template ${tmpl}: getInfo gives it back`, ai.templateId === tmpl, JSON.stringify(ai))
    } finally {
      await alt.kill()
    }
  }

  // Snapshots and forks (SDK lines that have them; SNAPSHOTS=1 where the
  // runtime snapshots, 0 where it must refuse): what the sandbox wrote goes to every sandbox
  // started from its snapshot and to each copy of a fork; each copy
  // diverges alone, with its own placeholder, and its egress is policed.
  if (typeof sbx.fork === 'function' && process.env.SNAPSHOTS === '1') {
    await sbx.updateNetwork({ allowOut: ['api.example.test', 'other.example.test'] })
    const curlTo = (host) => `curl -sS -m 20 -H "Authorization: Bearer $TOKEN" -w '\\n%{http_code}' https://${host}/e2b; echo " exit=$?"`
    await sbx.commands.run('echo snap-state > /tmp/snap-state')
    const name = 'e2e-' + process.env.RUN
    const snap = await sbx.createSnapshot({ name })
    check('createSnapshot answers its id and names', snap.snapshotId === name && snap.names.includes(name), JSON.stringify(snap))
    const listed = await Sandbox.listSnapshots({ sandboxId: sbx.sandboxId }).nextItems()
    check('listSnapshots by sandbox lists it', listed.length === 1 && listed[0].snapshotId === name, JSON.stringify(listed))
    const byName = await Sandbox.listSnapshots({ name: 'no-such-snapshot' }).nextItems()
    check('listSnapshots by an unknown name lists nothing', byName.length === 0, JSON.stringify(byName))
    const fromSnap = await Sandbox.create(name, { timeoutMs: 120_000 })
    try {
      check('Sandbox.create(snapshotId) starts from the state', (await fromSnap.commands.run('cat /tmp/snap-state')).stdout === 'snap-state\n')
      const e = await expectError('deleteSnapshot while a sandbox started from it runs → SandboxError', () => Sandbox.deleteSnapshot(name), SandboxError)
      check('deleteSnapshot in use: a 409 saying why', e && /^409: .*in use/.test(e.message), e && e.message)
    } finally {
      await fromSnap.kill()
    }
    check('deleteSnapshot', await Sandbox.deleteSnapshot(name) === true)
    check('deleteSnapshot again is false', await Sandbox.deleteSnapshot(name) === false)

    const forks = await sbx.fork({ count: 2, timeoutMs: 120_000 })
    try {
      check('fork({count: 2}) gives two sandboxes', forks.length === 2 && forks.every((f) => f instanceof Sandbox), JSON.stringify(forks.map(String)))
      const ids = new Set([sbx.sandboxId])
      const phs = new Set([(await sbx.commands.run('printf %s "$TOKEN"')).stdout])
      for (const [i, f] of forks.entries()) {
        ids.add(f.sandboxId)
        check(`fork ${i}: sees the state`, (await f.commands.run('cat /tmp/snap-state')).stdout === 'snap-state\n')
        await f.commands.run(`echo ${i} > /tmp/mine`)
        const ph = (await f.commands.run('printf %s "$TOKEN"')).stdout
        check(`fork ${i}: its own placeholder, never the real value`, ph.length > 8 && !phs.has(ph) && ph !== process.env.SECRET_REAL, ph)
        phs.add(ph)
        const g = await f.commands.run(curlTo('api.example.test'))
        check(`fork ${i}: the bound host receives the real value`, hello(g, 'api.example.test'), out(g))
        if (hello(g, 'api.example.test')) report.bound = (report.bound || 0) + 1
        const d = await f.commands.run(curlTo('other.example.test'))
        check(`fork ${i}: the placeholder to another allowed host is refused`, !hello(d, 'other.example.test'), out(d))
      }
      check('fork: every copy is a sandbox of its own', ids.size === 3, JSON.stringify([...ids]))
      const mine = await Promise.all(forks.map(async (f) => (await f.commands.run('cat /tmp/mine')).stdout))
      check('fork: each copy diverged alone', mine[0] === '0\n' && mine[1] === '1\n', JSON.stringify(mine))
      const p = await sbx.commands.run('cat /tmp/mine 2>/dev/null; echo end')
      check('fork: the parent sees none of the copies\' writes', p.stdout === 'end\n', JSON.stringify(p.stdout))
    } finally {
      for (const f of forks) if (f instanceof Sandbox) await f.kill().catch(() => {})
    }
    await expectError('fork of another tenant\'s sandbox → SandboxNotFoundError', () => Sandbox.fork(process.env.OTHER_ID, { count: 1 }), SandboxNotFoundError)
  } else if (typeof sbx.fork === 'function' && process.env.SNAPSHOTS === '0') {
    // A runtime that cannot snapshot (yet) says so, and nothing is made.
    const e = await expectError('createSnapshot on a runtime that cannot snapshot → SandboxError', () => sbx.createSnapshot({ name: 'e2e-no-' + process.env.RUN }), SandboxError)
    check('createSnapshot refused: a 400 naming the runtime', e && /^400: .*runtime cannot snapshot/.test(e.message), e && e.message)
    const left = await Sandbox.listSnapshots({ sandboxId: sbx.sandboxId }).nextItems()
    check('a refused createSnapshot leaves no snapshot', left.length === 0, JSON.stringify(left))
  }

  // Control plane.
  const found = await Sandbox.list({ query: { metadata: { run: process.env.RUN } } }).nextItems()
  check('Sandbox.list with a metadata filter', found.length === 1 && found[0].sandboxId === sbx.sandboxId && found[0].metadata.suite === 'e2b-e2e', JSON.stringify(found))
  const none = await Sandbox.list({ query: { metadata: { run: 'no-such-run' } } }).nextItems()
  check('Sandbox.list filter that matches nothing', none.length === 0, JSON.stringify(none))
  const gi = await Sandbox.getInfo(sbx.sandboxId)
  check('Sandbox.getInfo', gi.sandboxId === sbx.sandboxId && gi.state === 'running' && gi.metadata.run === process.env.RUN, JSON.stringify(gi))
  // setTimeout moves the end of the lifetime.
  await sbx.setTimeout(1_800_000)
  const end = (await Sandbox.getInfo(sbx.sandboxId)).endAt.getTime() - Date.now()
  check('setTimeout moves endAt', end > 1_700_000 && end <= 1_800_000, end)
  // Paging: two sandboxes of this run, one a page, x-next-token between.
  // The second sandbox is public (network.allowPublicTraffic true): its
  // ports need no token.
  second = await Sandbox.create({ timeoutMs: 120_000, metadata: { run: process.env.RUN }, network: { allowPublicTraffic: true } })
  check('a public sandbox has no trafficAccessToken', !second.trafficAccessToken, second.trafficAccessToken)
  await serve(second, 'hello from the public port')
  f = await fetchHost(second.getHost(8000))
  check('getHost of a public sandbox needs no token', f.status === 200 && f.body === 'hello from the public port', JSON.stringify(f))
  const pager = Sandbox.list({ query: { metadata: { run: process.env.RUN } }, limit: 1 })
  const p1 = await pager.nextItems()
  const more = pager.hasNext
  const p2 = more ? await pager.nextItems() : []
  check('Sandbox.list pages with x-next-token', p1.length === 1 && more && p2.length === 1 && !pager.hasNext &&
    [p1[0].sandboxId, p2[0].sandboxId].sort().join() === [sbx.sandboxId, second.sandboxId].sort().join(),
  JSON.stringify({ p1: p1.map((x) => x.sandboxId), p2: p2.map((x) => x.sandboxId), more }))
  const k1 = await second.kill()
  check('kill the second sandbox (the instance method), then again (false)', k1 !== false && await Sandbox.kill(second.sandboxId) === false, k1)
  second = undefined
  const again = await Sandbox.connect(sbx.sandboxId)
  check('Sandbox.connect, then run', (await again.commands.run('echo again')).stdout === 'again\n')

  // Another tenant's sandbox does not exist for this key.
  await expectError("Sandbox.connect to another tenant's sandbox → SandboxNotFoundError", () => Sandbox.connect(process.env.OTHER_ID), SandboxNotFoundError)
  await expectError("Sandbox.getInfo of another tenant's sandbox → NotFoundError", () => Sandbox.getInfo(process.env.OTHER_ID), NotFoundError)
  check("Sandbox.kill of another tenant's sandbox is false", await Sandbox.kill(process.env.OTHER_ID) === false)

  // Kill twice; not running after.
  check('Sandbox.kill', await Sandbox.kill(sbx.sandboxId) === true)
  check('Sandbox.kill again is false', await Sandbox.kill(sbx.sandboxId) === false)
  check('isRunning is false after kill', await sbx.isRunning() === false)
  sbx = undefined
} catch (e) {
  report.fatal = errName(e) + '\n' + (e && e.stack)
} finally {
  if (sbx) await Sandbox.kill(sbx.sandboxId).catch(() => {})
  if (second) await Sandbox.kill(second.sandboxId).catch(() => {})
}
process.stdout.write(JSON.stringify(report))

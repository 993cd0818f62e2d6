// Times the official E2B SDK against cagebox's E2B front and, on the same
// daemon and tenant, cagebox's own TypeScript SDK (sdk/typescript), side by
// side (bench/e2b.go runs it; `go run ./bench -only e2b`):
//
//   - Sandbox.create() → the first commands.run('true') done, with a warm
//     pool (the pool refills between samples; waited for over the admin
//     socket), against cb.create() → sb.exec(['true']) and against the
//     same with the E2B SDK's command (`/bin/bash -l -c true`);
//   - commands.run('true') round trip in a running sandbox against
//     sb.exec(['true']), and against sb.exec of what the E2B SDK runs for
//     it (`/bin/bash -l -c true`: a login shell), which tells the front's
//     own cost from the command's;
//   - files.write of 1 MiB against sb.files.write.
//
// The environment is the SDK's (E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY),
// CAGEBOX_HOST/CAGEBOX_API_KEY (the same tenant's key, cagebox's form),
// CAGEBOX_HOME (the admin socket, for the pool), POOL_CLASS, N. It prints
// one JSON object of millisecond samples; every sandbox it makes, it kills.
import { randomBytes } from 'node:crypto'
import { Sandbox } from 'e2b'
import { Cagebox } from '../../sdk/typescript/dist/index.js'

const n = Number(process.env.N || 15)
const cb = new Cagebox({ host: process.env.CAGEBOX_HOST, apiKey: process.env.CAGEBOX_API_KEY })
const admin = new Cagebox({ home: process.env.CAGEBOX_HOME })
const now = () => performance.now()

async function poolReady () {
  for (;;) {
    const p = await admin.pools()
    const c = (p.pools || []).find((x) => x.class === process.env.POOL_CLASS)
    if (c && c.ready >= c.target) return
    await new Promise((resolve) => setTimeout(resolve, 20))
  }
}

const out = { create: { e2b: [], cagebox: [], cageboxBash: [] }, run: { e2b: [], cagebox: [], cageboxBash: [] }, write: { e2b: [], cagebox: [] } }
const made = []
try {
  for (let i = 0; i < n; i++) {
    await poolReady()
    let t = now()
    const sbx = await Sandbox.create('base')
    await sbx.commands.run('true')
    out.create.e2b.push(now() - t)
    made.push(() => sbx.kill())
    await poolReady()
    t = now()
    const sb = await cb.create({ image: 'default', runtime: 'container' })
    await sb.exec(['true'])
    out.create.cagebox.push(now() - t)
    made.push(() => sb.remove())
    // The same first command as the E2B SDK's (a login shell).
    await poolReady()
    t = now()
    const sb2 = await cb.create({ image: 'default', runtime: 'container' })
    await sb2.exec(['/bin/bash', '-l', '-c', 'true'])
    out.create.cageboxBash.push(now() - t)
    made.push(() => sb2.remove())
  }
  const sbx = await Sandbox.create('base')
  made.push(() => sbx.kill())
  const sb = await cb.create({ image: 'default', runtime: 'container' })
  made.push(() => sb.remove())
  const mib = randomBytes(1 << 20)
  await sbx.commands.run('true')
  await sb.exec(['true'])
  for (let i = 0; i < 10 * n; i++) {
    let t = now()
    await sbx.commands.run('true')
    out.run.e2b.push(now() - t)
    t = now()
    await sb.exec(['true'])
    out.run.cagebox.push(now() - t)
    // What the E2B SDK asks for: its commands run as `/bin/bash -l -c CMD`.
    t = now()
    await sb.exec(['/bin/bash', '-l', '-c', 'true'])
    out.run.cageboxBash.push(now() - t)
  }
  for (let i = 0; i < 2 * n; i++) {
    let t = now()
    await sbx.files.write('/tmp/mib', mib.buffer.slice(mib.byteOffset, mib.byteOffset + mib.length))
    out.write.e2b.push(now() - t)
    t = now()
    await sb.files.write('/tmp/mib', mib)
    out.write.cagebox.push(now() - t)
  }
} catch (e) {
  out.fatal = String(e && e.stack ? e.stack : e)
} finally {
  for (const kill of made) {
    try { await kill() } catch {}
  }
}
console.log(JSON.stringify(out))

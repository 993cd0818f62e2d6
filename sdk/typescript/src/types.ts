/** Wire types of the cagebox API (api/types.go, api/openapi.json). Times are RFC 3339 strings. */

export type PolicyDocument = Record<string, unknown>;

export interface Health { version: string; tenant: string; sandboxes: number }

export interface Runtime {
  name: string; class: string; available: boolean; reason?: string; detail?: string; default?: boolean;
}

export interface ImageConfig {
  env?: string[]; entrypoint?: string[]; cmd?: string[]; working_dir?: string; user?: string;
}

export interface Image {
  name: string; size_bytes: number; created_at: string; digest: string; source?: string;
  manifest_digest?: string; platform_digest?: string; config?: ImageConfig;
}

export interface PullImageRequest { ref: string; name?: string; force?: boolean; max_bytes?: number; max_files?: number }

export interface HMACSigning {
  algorithm?: string; header: string; prefix?: string; encoding?: string; sign: string[]; max_body?: number;
}

export interface SecretBinding {
  /** The guest's environment variable. */
  name: string;
  /** A stored secret (default: name). */
  secret?: string;
  /** An inline value (write-only), with hosts. */
  value?: string;
  hosts?: string[];
  body?: boolean;
  headers?: string[];
  query?: string[];
  /** "" (placeholder), "env", "sigv4" or "hmac". */
  mode?: string;
  hmac?: HMACSigning;
}

export interface BoundSecret {
  name: string; secret: string; hosts: string[]; mode: string; headers?: string[]; query?: string[]; hmac?: HMACSigning;
}

export interface Resources { memory_bytes: number; cpus: number; pids: number; disk_bytes: number }

export interface Network { address: string; gateway: string; host_interface: string }

export interface SandboxInfo {
  id: string; tenant: string; runtime: string; class: string; image: string; status: string; error?: string;
  resources: Resources; created_at: string; expires_at?: string; idle_timeout?: string; idle_action?: string;
  last_active: string; network?: Network; policy?: PolicyDocument; secrets?: BoundSecret[];
  real_values_in_guest?: string[]; mounts?: Mount[]; read_only_root?: boolean;
  /** The syscall audit (absent when off). */
  audit?: SandboxAudit;
  /** Published ports (tokens only in the answer to create). */
  ports?: Port[];
  /** The last wake from an idle pause, and why. */
  last_wake?: { reason: string; at: string };
  labels?: Record<string, string>;
  /** The snapshot it was started from (a fork's copies: the fork's). */
  snapshot?: string;
  /** What survives: "restart" (running or paused) or "reboot" (a hibernated microVM). */
  persists?: "restart" | "reboot";
}

/** A sandbox's syscall audit (api.SandboxAudit). */
export interface SandboxAudit {
  classes: string[];
  unrecorded?: string[];
  note?: string;
  recorded: number;
  dropped: number;
  rate: number;
  burst: number;
}

/** A host path (type "bind", below the daemon's --mount-root) or a volume
 * (type "volume"): read-only, nosuid, nodev and noexec unless rw / exec. */
export interface Mount { type: "bind" | "volume"; src: string; dst: string; rw?: boolean; exec?: boolean }

export interface CreateVolumeRequest { name: string; size_bytes?: number }

export interface Volume {
  name: string; size_bytes: number; created_at: string; vm_only?: boolean;
  attached_to?: { sandbox: string; rw?: boolean }[];
}

/** A saved sandbox that new sandboxes start from (api.Snapshot). */
export interface Snapshot {
  name: string; tenant: string; sandbox: string; runtime: string; image: string;
  /** "memory": a microVM's memory, devices and disks (processes go on);
   * "filesystem": the writable layer (sandboxes boot afresh on its files). */
  kind: "memory" | "filesystem";
  resources: Resources; size_bytes: number; digest: string;
  /** Made by a fork; removed with the last sandbox started from it. */
  fork?: boolean;
  /** Sandboxes started from it that still exist (a snapshot in use cannot be removed). */
  in_use: number;
  created_at: string;
}

export interface ForkRequest { count?: number; labels?: Record<string, string>; timeout?: string }

export interface ForkResponse { snapshot: Snapshot; sandboxes: SandboxInfo[] }

export interface CreateSandboxRequest {
  runtime?: string; image?: string; memory_bytes?: number; cpus?: number; pids?: number; disk_bytes?: number;
  timeout?: string; idle_timeout?: string; idle_action?: string; env?: string[]; policy?: PolicyDocument;
  allow?: string[]; policy_ref?: string; secrets?: SecretBinding[]; mounts?: Mount[]; read_only_root?: boolean;
  /** Syscall audit classes: exec, net, file, priv, or all (off by default). */
  audit?: string[];
  /** Ports to publish through the ingress listener once the sandbox runs. */
  publish?: PortSpec[];
  /** One of the tenant's snapshots to start from. */
  from_snapshot?: string;
}

/** A port to publish (api.PortSpec). */
export interface PortSpec {
  port: number;
  public?: boolean;
  ttl?: string;
}

export interface ExecRequest {
  argv: string[]; env?: string[]; cwd?: string; user?: string; timeout?: string; stdin?: boolean;
}

export interface ExecFrame {
  stream: "stdout" | "stderr" | "exit" | "error";
  /** base64 */
  data?: string;
  exit_code?: number; signal?: string; timed_out?: boolean; oom_killed?: boolean; error?: string;
}

export interface FileInfo { name: string; size: number; mode: string; mod_time: string; is_dir: boolean }

export interface Tenant {
  id: string; name: string; min_isolation?: string; untrusted?: boolean; floor?: string; created_at: string;
}

export interface APIKey { id: string; tenant: string; prefix: string; key?: string; created_at: string }

export interface Event {
  seq: number; time: string; tenant: string; sandbox?: string; kind: string; data?: Record<string, unknown>;
}

export interface Secret {
  name: string; tenant: string; hosts: string[]; inject?: string; preview: string; version: number;
  created_at: string; updated_at: string; revoked_at?: string; allow_env: boolean;
}

export interface SandboxPolicy { generation: number; policy: PolicyDocument; ref?: string; frozen?: boolean }

export interface PolicyRule {
  name?: string; host: string; ports?: number[]; methods?: string[]; paths?: string[];
  action: "allow" | "deny" | "hold"; protocol?: string; when?: string; timeout?: string;
}

export interface PolicyPatch { op: "add" | "remove" | "move"; rule?: PolicyRule; name?: string; index?: number }

export interface PolicyVersion { generation: number; actor: string; reason?: string; created_at: string; policy: PolicyDocument }

export interface BudgetUsage {
  name: string; requests: number; bytes_up: number; bytes_down: number; spend: number;
  max_requests?: number; max_bytes_up?: number; max_bytes_down?: number; max_spend?: number; rate?: number;
  exhausted: boolean;
}

export interface NamedPolicy { name: string; generation: number; policy: PolicyDocument; updated_at: string; updated?: string[] }

export interface Approval {
  id: string; sandbox: string; rule: string; request: Record<string, unknown>; state: string; decided_by?: string;
  reason?: string; remember?: boolean; created_at: string; deadline: string;
}

export interface FreezeResult { sandboxes: string[] }

export interface PoolStatus {
  class: string; runtime: string; image: string; memory_bytes: number; target: number; ready: number; filling: boolean;
  claims: number; misses: number; fills: number; failures: number; last_error?: string; last_fill_ms: number;
}

export interface Pools { pools: PoolStatus[]; memory_budget: number; memory_used: number }

export interface Tool {
  name: string; description?: string; argv: string[]; input_file?: string; image?: string; runtime?: string;
  runtime_floor?: string; allow?: string[]; policy_ref?: string; secrets?: SecretBinding[]; env?: string[];
  timeout?: string; memory_bytes?: number; cpus?: number; input_schema?: Record<string, unknown>; created_at?: string;
}

export interface EgressDecision { host: string; method?: string; path?: string; allowed: boolean; rule?: string; reason?: string }

export interface ExecuteResult {
  tool: string; sandbox: string; runtime: string; pooled: boolean; exit_code: number; timed_out?: boolean;
  oom_killed?: boolean; stdout: string; stderr: string; stdout_truncated?: boolean; stderr_truncated?: boolean;
  duration_ms: number; egress: EgressDecision[];
}

export interface ApprovalDecisionBody { decision: "allow" | "deny"; remember?: boolean; reason?: string }

export interface AccessRequest { host: string; reason?: string; timeout?: string }

export interface AccessResult { approval: string; allowed: boolean; by?: string; reason?: string }

/** A published port (api.Port). */
export interface Port {
  port: number;
  public: boolean;
  url?: string;
  path_url?: string;
  expires_at?: string;
  created_at: string;
  /** The access token: in the answer to publish only. */
  token?: string;
}

/** A relay's connection (api.RelayState). */
export interface RelayState {
  connected: boolean;
  failed?: boolean;
  session_id?: string;
  seq: number;
  reconnects: number;
  resumes: number;
  received: number;
  dropped: number;
  last_error?: string;
}

/** A sandbox's relay (api.Relay). */
export interface Relay {
  name: string;
  sandbox_id: string;
  kind: string;
  port: number;
  path: string;
  /** The vault secret's name, never its value. */
  token_secret?: string;
  intents?: number;
  url?: string;
  /** As given: {secret} stays a placeholder. */
  headers?: string[];
  created_at: string;
  state: RelayState;
  /** Events queued, not yet delivered. */
  pending: number;
}

/** A sandbox's webhook (api.Webhook); url and token only in the answer to its creation. */
export interface Webhook {
  name: string;
  sandbox_id: string;
  port: number;
  path: string;
  verify: string;
  /** The vault secret's name, never its value. */
  secret: string;
  url?: string;
  token?: string;
  created_at: string;
  /** Deliveries not yet delivered. */
  pending: number;
}

/** A signed URL of a port (api.PortURL). */
export interface PortURL {
  url: string;
  expires_at: string;
}

-- longcall schema, version 1.
-- Money and capacity are kept as counters on owners (checked, updated in the
-- same transaction as each job transition) and as an append-only ledger with
-- one row per job and entry kind (so a job can never be charged or refunded
-- twice: the database refuses the second row).

create table owners (
    id          text primary key check (id ~ '^own_[0-9a-f]{24}$'),
    name        text not null check (length(name) between 1 and 200),
    granted     bigint not null default 0 check (granted >= 0),
    balance     bigint not null default 0 check (balance >= 0),
    reserved    bigint not null default 0 check (reserved >= 0),
    charged     bigint not null default 0 check (charged >= 0),
    active      integer not null default 0 check (active >= 0),
    max_active  integer not null default 10 check (max_active >= 0),
    created_at  timestamptz not null default now(),
    check (granted = balance + reserved + charged)
);

-- API keys are random 32-byte secrets; only their SHA-256 is stored. The
-- prefix (the key's first characters) names a key for revocation and logs.
create table api_keys (
    prefix      text primary key,
    key_hash    bytea not null unique,
    owner_id    text not null references owners (id),
    created_at  timestamptz not null default now(),
    revoked_at  timestamptz
);
create index api_keys_owner on api_keys (owner_id);

create table jobs (
    id                        text primary key check (id ~ '^job_[0-9a-f]{24}$'),
    owner_id                  text not null references owners (id),
    request_key               text check (length(request_key) between 1 and 255),
    request_digest            bytea not null,
    provider                  text not null,
    model                     text not null,
    input                     jsonb not null,
    status                    text not null default 'queued' check (status in
                                ('queued', 'submitting', 'running', 'uncertain',
                                 'succeeded', 'failed', 'cancelled', 'expired')),
    provider_task_id          text,
    provider_operation        jsonb,
    webhook_secret            bytea,          -- encrypted (app/signing/secretbox.py)
    callback_registered       boolean not null default false,
    provider_call_started_at  timestamptz,    -- set once, by the first submit attempt
    -- A submit call is out and its outcome not yet known: set before each
    -- call, cleared by a definite answer. Still set on the next attempt means
    -- the last call's fate is unknown (a crash): look the task up, do not
    -- submit blindly.
    submit_in_doubt           boolean not null default false,
    submit_attempts           integer not null default 0 check (submit_attempts >= 0),
    last_error                text,
    credits_reserved          bigint not null check (credits_reserved >= 1),
    credits_charged           bigint not null default 0 check (credits_charged >= 0),
    credits_refunded          bigint not null default 0 check (credits_refunded >= 0),
    deadline_at               timestamptz not null,
    recheck_requested_at      timestamptz,    -- read-triggered re-checks, rate limited
    error_code                text,
    error_message             text,
    created_at                timestamptz not null default now(),
    updated_at                timestamptz not null default now(),
    finished_at               timestamptz,
    unique (owner_id, request_key),
    -- In flight nothing has moved; once terminal everything reserved is
    -- either charged or refunded, and the secret is gone.
    check (
        case when status in ('succeeded', 'failed', 'cancelled', 'expired')
             then credits_charged + credits_refunded = credits_reserved
                  and finished_at is not null and webhook_secret is null
             else credits_charged = 0 and credits_refunded = 0 and finished_at is null
        end
    ),
    check (status not in ('failed', 'cancelled', 'expired') or credits_charged = 0)
);
-- The owner's list, newest first (keyset pagination on (created_at, id)).
create index jobs_owner_created on jobs (owner_id, created_at desc, id desc);
-- In-flight jobs only: the sweep and the status screen read this, and it
-- stays small however many jobs have finished.
create index jobs_in_flight on jobs (updated_at)
    where status in ('queued', 'submitting', 'running', 'uncertain');

create table ledger (
    id          bigserial primary key,
    owner_id    text not null references owners (id),
    job_id      text references jobs (id),
    kind        text not null check (kind in ('grant', 'reserve', 'charge', 'refund')),
    amount      bigint not null check (amount >= 0),
    created_at  timestamptz not null default now(),
    check ((kind = 'grant') = (job_id is null)),
    unique (job_id, kind)
);
create index ledger_owner on ledger (owner_id);

create table assets (
    job_id        text not null references jobs (id),
    index         integer not null check (index >= 0),
    storage_key   text not null,
    bytes         bigint not null check (bytes >= 0),
    sha256        text not null check (sha256 ~ '^[0-9a-f]{64}$'),
    content_type  text,
    created_at    timestamptz not null default now(),
    primary key (job_id, index)
);

-- Intents: at most one open intent per job and kind. Small rows, high churn.
create table outbox (
    id             bigserial primary key,
    job_id         text not null references jobs (id),
    kind           text not null check (kind in ('submit', 'settle', 'cancel')),
    not_before     timestamptz not null default now(),
    claimed_until  timestamptz,
    generation     integer not null default 0,
    attempts       integer not null default 0 check (attempts >= 0),
    unique (job_id, kind)
) with (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000,
        autovacuum_analyze_scale_factor = 0.02, fillfactor = 80);
create index outbox_due on outbox (not_before);

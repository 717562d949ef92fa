-- Telling the app (CONTRACT.md: Notifications to the client, the job's
-- timeline, metadata). Every row here is written by the statement that does
-- the work it records (app/domain/jobs.py, app/domain/notifications.py), so
-- a rolled-back transition leaves none and a committed one never lacks its own.

-- What the client sent with the job, echoed back; never sent to a provider.
alter table jobs add column metadata jsonb not null default '{}'::jsonb
    check (jsonb_typeof(metadata) = 'object');

-- An owner's notification endpoints. The secret is encrypted like the
-- per-job secrets (app/signing/secretbox.py); a deleted endpoint is kept
-- (its deliveries name it) and gets nothing more.
create table webhook_endpoints (
    id          text primary key check (id ~ '^we_[0-9a-f]{24}$'),
    owner_id    text not null references owners (id),
    url         text not null check (length(url) between 1 and 2048),
    events      text[] not null check (cardinality(events) between 1 and 6),
    secret      bytea not null,
    created_at  timestamptz not null default now(),
    deleted_at  timestamptz
);
create index webhook_endpoints_owner on webhook_endpoints (owner_id) where deleted_at is null;

-- One per notified transition: `data` is the job as the API showed it then
-- (without the signed URLs, added when it is sent).
create table notifications (
    id          text primary key check (id ~ '^evt_[0-9a-f]{32}$'),
    owner_id    text not null references owners (id),
    job_id      text not null references jobs (id),
    type        text not null check (type in ('job.running', 'job.uncertain', 'job.succeeded',
                                              'job.failed', 'job.cancelled', 'job.expired')),
    data        jsonb not null,
    created_at  timestamptz not null default now()
);
create index notifications_owner on notifications (owner_id, created_at desc, id desc);
create index notifications_job on notifications (job_id);

-- One per notification and matching endpoint; its `notify` intent is the
-- timer that sends it.
create table deliveries (
    id                bigserial primary key,
    notification_id   text not null references notifications (id),
    endpoint_id       text not null references webhook_endpoints (id),
    status            text not null default 'pending' check (status in ('pending', 'delivered', 'failed')),
    attempts          integer not null default 0 check (attempts >= 0),
    last_status_code  integer,
    last_attempt_at   timestamptz,
    last_error        text check (length(last_error) <= 300),
    -- Retries go on for 24 h from here: the notification's creation, or the
    -- moment an owner asked for it again (redeliver).
    retry_from        timestamptz not null default now(),
    unique (notification_id, endpoint_id)
);
create index deliveries_endpoint on deliveries (endpoint_id) where status = 'pending';
create index deliveries_failed on deliveries (endpoint_id) where status = 'failed';  -- longcall status

-- Every attempt, for support ("what did my endpoint answer?"): at most a few
-- dozen per delivery over its 24 h.
create table delivery_attempts (
    delivery_id  bigint not null references deliveries (id),
    at           timestamptz not null default now(),
    status_code  integer,
    error        text check (length(error) <= 300)
);
create index delivery_attempts_delivery on delivery_attempts (delivery_id, at);

-- The job's timeline: small rows, appended by the statements that do the work.
create table job_events (
    id      bigserial primary key,
    job_id  text not null references jobs (id),
    at      timestamptz not null default clock_timestamp(),
    type    text not null check (type in ('created', 'submit_sent', 'task_saved', 'call_started',
                                          'webhook_accepted', 'status_checked', 'output_stored', 'closed',
                                          'notification_delivered', 'notification_failed')),
    detail  jsonb not null default '{}'::jsonb check (octet_length(detail::text) <= 8192)
);
create index job_events_job on job_events (job_id, id);

-- `notify` intents: one per delivery, so (job, kind) is no longer unique on
-- its own. Every other kind keeps one open intent per job (delivery_id null,
-- and nulls count as equal here).
alter table outbox add column delivery_id bigint references deliveries (id);
alter table outbox drop constraint outbox_kind_check;
alter table outbox add constraint outbox_kind_check check (kind in ('submit', 'settle', 'cancel', 'notify'));
alter table outbox add constraint outbox_delivery_kind check ((kind = 'notify') = (delivery_id is not null));
alter table outbox drop constraint outbox_job_id_kind_key;
alter table outbox add constraint outbox_job_kind_delivery unique nulls not distinct (job_id, kind, delivery_id);

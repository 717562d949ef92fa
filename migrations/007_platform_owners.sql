-- Platform owners (CONTRACT.md: Apps with many users). A platform's keys
-- create owners under it, grant them credits and act for them.
alter table owners add column is_platform boolean not null default false;
alter table owners add column platform_id text references owners (id);
-- A retried sign-up (`POST /v1/owners` with an Idempotency-Key) makes one
-- owner: the key is the platform's, its digest tells a replay from another body.
alter table owners add column request_key text check (length(request_key) between 1 and 255);
alter table owners add column request_digest bytea;
alter table owners add constraint owners_one_level check (not (is_platform and platform_id is not null));
alter table owners add constraint owners_keyed_under_platform
    check ((request_key is null or platform_id is not null) and ((request_key is null) = (request_digest is null)));
alter table owners add constraint owners_platform_request_key unique (platform_id, request_key);
-- A platform's owners, newest first (keyset pagination on (created_at, id)).
create index owners_platform on owners (platform_id, created_at desc, id desc) where platform_id is not null;

-- Grants may now take credits back (a negative amount, never below a zero
-- balance: the owners row's own checks hold that). A grant made through the
-- API carries its reason and the platform's Idempotency-Key; the key is
-- scoped to the owner (and so to its one platform).
alter table ledger drop constraint ledger_amount_check;
alter table ledger add constraint ledger_amount_check
    check (case when kind = 'grant' then amount <> 0 else amount >= 0 end);
alter table ledger add column reason text check (length(reason) <= 500);
alter table ledger add column request_key text check (length(request_key) between 1 and 255);
alter table ledger add column request_digest bytea;
alter table ledger add constraint ledger_keyed_grant
    check ((request_key is null or kind = 'grant') and ((request_key is null) = (request_digest is null)));
create unique index ledger_grant_key on ledger (owner_id, request_key) where request_key is not null;

-- A notification of a platform's owner's job is the platform's too: its
-- endpoints receive it and its key lists it.
alter table notifications add column platform_id text references owners (id);
create index notifications_platform on notifications (platform_id, created_at desc, id desc)
    where platform_id is not null;

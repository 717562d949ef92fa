-- What the operator's console (/console) looks up, each by an index so a
-- page costs the same with ten jobs or ten million.

-- Search by the provider's task id: the id a customer or a provider's
-- dashboard quotes.
create index jobs_provider_task on jobs (provider_task_id) where provider_task_id is not null;

-- The closed jobs that need a human's eyes, newest first. Small: only the
-- rare error codes are in it.
create index jobs_needs_human on jobs (error_code, finished_at desc, id desc)
    where error_code in ('settle_exhausted', 'call_lost', 'output_expired');

-- Every owner, newest first (keyset pagination on (created_at, id)).
create index owners_created on owners (created_at desc, id desc);

-- An owner's grants, newest first (a busy owner has millions of job rows in
-- the ledger beside a handful of grants).
create index ledger_grants on ledger (owner_id, id desc) where kind = 'grant';

-- What finished lately, newest first: the fleet's counts of the last hour and
-- its list of the latest closes (one entry per job, made when it closes).
create index jobs_finished on jobs (finished_at desc, id desc) where finished_at is not null;

-- Provider capacity (CONTRACT.md: MAX_IN_FLIGHT_<PROVIDER>, a models-file
-- entry's max_in_flight): jobs submitted and not yet closed are counted
-- here, by provider and by the entry whose cap they were claimed under.
alter table jobs add column capacity_entry text;
create index jobs_submitted on jobs (provider, capacity_entry)
    where status in ('submitting', 'running', 'uncertain');

-- A provider that answered 429 (or 529) with Retry-After: no settler submits
-- to it until `until` (app/domain/capacity.py).
create table provider_pauses (
    provider  text primary key,
    until     timestamptz not null,
    reason    text
);

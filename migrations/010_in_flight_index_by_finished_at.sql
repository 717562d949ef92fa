-- The in-flight index, keyed by what only the readers of every job in flight
-- ask: `finished_at is null` (the same jobs: a job is terminal exactly when
-- finished_at is set, by the jobs table's check). Its predicate was the
-- in-flight status list, which every statement that checks one job's status
-- by its id states too, so PostgreSQL could plan those through this index;
-- with statistics taken while nearly every job was finished it priced the
-- index at nothing and read every job in flight per statement (a burst of
-- 3,000 in `longcall bench`: 1,300 buffers a webhook; see
-- tests/outbox/test_hot_plans.py).
drop index jobs_in_flight;
create index jobs_in_flight on jobs (updated_at) where finished_at is null;

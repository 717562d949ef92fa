-- The timeline's lines no longer check their job by a foreign key. Every
-- line is written by a statement that reads its job (or its notification,
-- whose own key names the job) in the same statement, and no job is ever
-- deleted, so the check never found anything; it cost each line a trigger
-- and a key look-up, about 8% of the webhook's one write (14-19 us of
-- PostgreSQL's CPU in five alternated rounds; webhook ingest 0.60 -> 0.63x
-- the minimal endpoint, `longcall bench --only ingest`). The chaos run
-- checks instead that every line names a job (proof/invariants.py,
-- timelines_tell_the_story).
alter table job_events drop constraint job_events_job_id_fkey;

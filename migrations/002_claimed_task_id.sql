-- A task id named by a verified webhook for a job whose submit is in doubt
-- (still submitting without a task id, or uncertain). Only a claim: the
-- settle step adopts it (provider_task_id) once the provider, asked with our
-- own credentials, confirms the task; a task the provider denies clears it.
alter table jobs add column claimed_task_id text
    check (length(claimed_task_id) between 1 and 200);

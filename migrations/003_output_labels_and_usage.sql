-- An output's label names it when a task has several kinds (a dubbing
-- language, a Suno track); null otherwise.
alter table assets add column label text check (length(label) between 1 and 200);

-- What the task used, as measured when it closed: [{"unit", "amount"}]
-- (app.vocabulary.UsageUnit). Pricing reads it; null until a success says.
alter table jobs add column usage jsonb check (jsonb_typeof(usage) = 'array');

-- How a succeeded job's charge was reached (app/pricing.py): the price, the
-- measure, the charge, and why when the measure could not be read or the
-- charge was capped. Null for jobs closed otherwise (nothing charged).
alter table jobs add column price_applied jsonb check (jsonb_typeof(price_applied) = 'object');

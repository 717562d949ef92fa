-- Notify intents found by their own index: a settler's claim looks for due
-- deliveries beside its submits and settles, and with only `outbox_due`
-- (every kind) that search read every due intent of the other kinds, the
-- whole backlog when jobs queue.
create index outbox_due_notify on outbox (not_before) where kind = 'notify';

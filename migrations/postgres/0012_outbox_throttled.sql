-- A bank that throttles (429, often with Retry-After) has not refused a payout: it asked
-- for time. `attempts` counts every claim, so a payout the bank throttled more times than
-- PAYONCE_PAYOUT_ATTEMPTS would have its key closed and its money returned while the bank
-- was only asking it to wait. `throttled` counts the claims the bank answered so; the
-- attempt budget weighs only the others, and a payout that keeps being throttled is
-- bounded by its age instead (PAYONCE_PAYOUT_THROTTLE_MAX_AGE). Webhook deliveries leave
-- it at 0.
ALTER TABLE outbox
    ADD COLUMN throttled INTEGER NOT NULL DEFAULT 0,
    ADD CONSTRAINT outbox_throttled_within_attempts
        CHECK (throttled >= 0 AND throttled <= attempts);

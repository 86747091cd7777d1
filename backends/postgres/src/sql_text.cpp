#include "sql_text.hpp"

namespace idem::postgres::detail {

std::string interest_lock(std::string_view function, std::string_view channel,
                          std::string_view key) {
  return std::string(function) + "(" + std::to_string(kInterestLockClass) + ", hashtext(" +
         std::string(channel) + " || ':' || " + std::string(key) + "))";
}

RecorderSql::RecorderSql(const PostgresOptions& options)
    : schema(detail::quote_identifier(options.schema)),
      log(schema + "." + detail::quote_identifier(options.processed_log_table)),
      claims(schema + "." + detail::quote_identifier(options.claims_table)),
      sequence(schema + "." + detail::quote_identifier(options.claims_table + "_token_seq")),
      select_marker("SELECT 1 FROM " + log + " WHERE consumer = $1 AND event_id = $2",
                    {kTextOid, kTextOid}),
      // The ids as one text[] parameter (one statement per batch, no SQL built from ids),
      // each looked up by its own primary-key probe: a LATERAL subquery with LIMIT is never
      // flattened into a join, so its plain equality is always an index condition on both
      // columns. `consumer = $1 AND event_id = ANY ($2)` left the planner free to scan the
      // consumer's every marker with the ids as a filter, which it chose whenever statistics
      // said the consumer had few markers: a new consumer, or a table not analyzed since
      // (DESIGN-NOTES §29, §31). Prepared: this plan is the best at any size, so the generic
      // plan is too (planning every run cost a third of a small batch's check).
      select_markers_many(
          "SELECT ids.id FROM unnest($2::text[]) AS ids (id) CROSS JOIN "
          "LATERAL (SELECT 1 FROM " +
              log + " WHERE consumer = $1 AND event_id = ids.id LIMIT 1) AS hit",
          {kTextOid, kTextArrayOid}),
      // DISTINCT: a batch may repeat an id, and one INSERT must not meet its own row twice.
      // ORDER BY: rows are inserted in id order, so two batches that share ids wait for each
      // other's uncommitted rows in one order and never deadlock (in hash order they did).
      insert_markers_many("INSERT INTO " + log +
                              " (consumer, event_id, ts) SELECT DISTINCT $1::text, id, $3 "
                              "FROM unnest($2::text[]) AS id ORDER BY id "
                              "ON CONFLICT (consumer, event_id) DO NOTHING",
                          {kTextOid, kTextArrayOid, kTimestamptzOid}),
      insert_marker("INSERT INTO " + log +
                        " (consumer, event_id, ts) VALUES ($1, $2, $3) "
                        "ON CONFLICT (consumer, event_id) DO NOTHING",
                    {kTextOid, kTextOid, kTimestamptzOid}),
      // One statement: the marker check, the claim itself (insert, or take over a claim whose
      // lease passed — never a done one), and the row as this statement's snapshot saw it.
      claim("WITH marker AS (SELECT 1 FROM " + log +
                " WHERE consumer = $1 AND event_id = $2), "
                "existing AS (SELECT lease_until, done_at FROM " +
                claims +
                " WHERE consumer = $1 AND event_id = $2), "
                "claimed AS (INSERT INTO " +
                claims +
                " AS c (consumer, event_id, token, lease_until) "
                "SELECT $1, $2, nextval('" +
                sequence +
                "'), $4 "
                "WHERE NOT EXISTS (SELECT 1 FROM marker) "
                "ON CONFLICT (consumer, event_id) DO UPDATE SET token = excluded.token, "
                "lease_until = excluded.lease_until, took_over = true "
                "WHERE c.done_at IS NULL AND c.lease_until <= $3 "
                "RETURNING token, lease_until, took_over) "
                "SELECT 'acquired'::text, token, lease_until, took_over FROM claimed "
                "UNION ALL SELECT 'processed', NULL, NULL, NULL FROM marker "
                "UNION ALL SELECT CASE WHEN done_at IS NULL THEN 'claimed' ELSE 'processed' END, "
                "NULL, lease_until, NULL FROM existing",
            {kTextOid, kTextOid, kTimestamptzOid, kTimestamptzOid}),
      // Read again with a fresh snapshot when the claim statement raced with another writer.
      reread("SELECT EXISTS (SELECT 1 FROM " + log +
                 " WHERE consumer = $1 AND event_id = $2), c.lease_until, c.done_at IS NOT NULL "
                 "FROM (SELECT 1) AS one LEFT JOIN " +
                 claims + " AS c ON c.consumer = $1 AND c.event_id = $2",
             {kTextOid, kTextOid}),
      // The claim stays, marked done, so a claim racing with this complete finds it (and
      // waits for its row lock) instead of inserting a new claim next to the new marker.
      complete("WITH done AS (UPDATE " + claims +
                   " SET done_at = $4 WHERE consumer = $1 AND event_id = $2 AND token = $3 "
                   "AND done_at IS NULL RETURNING 1), "
                   "marked AS (INSERT INTO " +
                   log +
                   " (consumer, event_id, ts) SELECT $1, $2, $4 FROM done "
                   "ON CONFLICT (consumer, event_id) DO NOTHING) "
                   "SELECT count(*) FROM done",
               {kTextOid, kTextOid, kInt8Oid, kTimestamptzOid}),
      release("DELETE FROM " + claims +
                  " WHERE consumer = $1 AND event_id = $2 AND token = $3 AND done_at IS NULL",
              {kTextOid, kTextOid, kInt8Oid}),
      renew("UPDATE " + claims +
                " SET lease_until = $4 WHERE consumer = $1 AND event_id = $2 AND token = $3 "
                "AND done_at IS NULL",
            {kTextOid, kTextOid, kInt8Oid, kTimestamptzOid}),
      // Inside run_transactional's transaction: the marker, and a done claim that fences any
      // exclusive-mode owner (a dead claim is replaced; a live one makes `fence` empty).
      transactional_mark("WITH marker AS (INSERT INTO " + log +
                             " (consumer, event_id, ts) VALUES ($1, $2, $3) "
                             "ON CONFLICT (consumer, event_id) DO NOTHING RETURNING 1), "
                             "fence AS (INSERT INTO " +
                             claims +
                             " AS c (consumer, event_id, token, lease_until, done_at) "
                             "SELECT $1, $2, nextval('" +
                             sequence +
                             "'), $3, $3 FROM marker "
                             "ON CONFLICT (consumer, event_id) DO UPDATE SET token = "
                             "excluded.token, lease_until = excluded.lease_until, "
                             "done_at = excluded.done_at, took_over = true "
                             "WHERE c.done_at IS NULL AND c.lease_until <= $3 RETURNING 1) "
                             "SELECT (SELECT count(*) FROM marker), (SELECT count(*) FROM fence)",
                         {kTextOid, kTextOid, kTimestamptzOid}),
      // One chunk of purge(): at most kPurgeChunkRows old markers after the key ($2, $3), in
      // primary-key order (the walk resumes where the last chunk stopped, so every chunk reads
      // only its part of the index); returns how many went and the chunk's last key. Planned
      // per run, so a purge scheduled from a table's first day keeps using the index.
      purge_chunk("WITH doomed AS (SELECT consumer, event_id FROM " + log +
                      " WHERE (consumer, event_id) > ($2, $3) AND ts < $1 "
                      "ORDER BY consumer, event_id LIMIT " +
                      std::to_string(kRecorderPurgeChunkRows) + "), gone AS (DELETE FROM " + log +
                      " AS l USING doomed AS d WHERE l.consumer = d.consumer AND "
                      "l.event_id = d.event_id RETURNING 1) "
                      "SELECT (SELECT count(*) FROM gone), consumer, event_id FROM doomed "
                      "ORDER BY consumer DESC, event_id DESC LIMIT 1",
                  {kTimestamptzOid, kTextOid, kTextOid}, detail::Planning::per_run),
      purge_claims("DELETE FROM " + claims + " WHERE coalesce(done_at, lease_until) < $1",
                   {kTimestamptzOid}),
      count_old_markers("SELECT count(*) FROM " + log + " WHERE ts < $1", {kTimestamptzOid}),
      count_markers("SELECT consumer, count(*) FROM " + log + " GROUP BY consumer", {}),
      count_live_claims("SELECT consumer, count(*) FROM " + claims +
                            " WHERE done_at IS NULL AND lease_until > $1 GROUP BY consumer",
                        {kTimestamptzOid}),
      inspect("SELECT (SELECT ts FROM " + log +
                  " WHERE consumer = $1 AND event_id = $2), c.token, c.lease_until "
                  "FROM (SELECT 1) AS one LEFT JOIN " +
                  claims + " AS c ON c.consumer = $1 AND c.event_id = $2 AND c.done_at IS NULL",
              {kTextOid, kTextOid}) {}

StoreSql::StoreSql(const PostgresOptions& options)
    : table(detail::quote_identifier(options.schema) + "." +
            detail::quote_identifier(options.records_table)),
      table_name(options.schema + "." + options.records_table),
      sequence(detail::quote_identifier(options.schema) + "." +
               detail::quote_identifier(options.records_table + "_token_seq")),
      channel(options.notify_channel.empty() ? options.schema + "_" + options.records_table
                                             : options.notify_channel),
      // One statement: the claim (insert, or reclaim an expired result or an abandoned
      // lease — never a live record), and the row as this statement's snapshot saw it, so a
      // losing claim can answer completed / in_progress / mismatch without another round trip.
      claim(std::string("WITH existing AS (SELECT ") + kRecordColumns + " FROM " + table +
                " WHERE key = $1), "
                "claimed AS (INSERT INTO " +
                table +
                " AS r (key, state, token, fingerprint, lease_until) "
                "VALUES ($1, 'in_progress', nextval('" +
                sequence +
                "'), $2, $4) "
                "ON CONFLICT (key) DO UPDATE SET state = 'in_progress', token = excluded.token, "
                "fingerprint = excluded.fingerprint, lease_until = excluded.lease_until, "
                "took_over = (r.state = 'in_progress'), completed_at = NULL, "
                "expires_at = NULL, value = NULL, report = NULL "
                "WHERE (r.state = 'completed' AND r.expires_at <= $3) "
                "OR (r.state = 'in_progress' AND r.lease_until <= $3) "
                "RETURNING token, took_over) "
                "SELECT true, token, took_over, NULL::text, NULL::bigint, NULL::text, "
                "NULL::timestamptz, NULL::boolean, NULL::timestamptz, NULL::timestamptz, "
                "NULL::bytea, NULL::text FROM claimed "
                "UNION ALL SELECT false, NULL, NULL, " +
                kRecordColumns + " FROM existing",
            {kTextOid, kTextOid, kTimestamptzOid, kTimestamptzOid}),
      lookup(std::string("SELECT ") + kRecordColumns + " FROM " + table + " WHERE key = $1",
             {kTextOid}),
      // complete and drop notify only when a waiter's listener holds the key's interest lock
      // (DESIGN-NOTES §62): a NOTIFY serializes every notifying commit in the cluster. When the
      // exclusive try succeeds, no listener holds the shared lock, and one that asks for it now
      // waits until this transaction has committed, then reads the record. One row per changed
      // record either way: the caller counts rows.
      complete(
          "WITH done AS (UPDATE " + table +
              " SET state = 'completed', completed_at = $3, expires_at = $4, value = $5, "
              "report = $6 WHERE key = $1 AND token = $2 AND state = 'in_progress' "
              "RETURNING key) SELECT CASE WHEN " +
              interest_lock("pg_try_advisory_xact_lock", "$7", "key") +
              " THEN NULL ELSE pg_notify($7, key) END FROM done",
          {kTextOid, kInt8Oid, kTimestamptzOid, kTimestamptzOid, kByteaOid, kTextOid, kTextOid}),
      drop("WITH gone AS (DELETE FROM " + table +
               " WHERE key = $1 AND token = $2 AND state = 'in_progress' RETURNING key) "
               "SELECT CASE WHEN " +
               interest_lock("pg_try_advisory_xact_lock", "$3", "key") +
               " THEN NULL ELSE pg_notify($3, key) END FROM gone",
           {kTextOid, kInt8Oid, kTextOid}),
      // The listener's session-level shared lock on a key it has waiters for ($1 the channel,
      // $2 the key); pg_advisory_lock_shared stacks, so each lock is unlocked exactly once.
      lock_interest("SELECT " + interest_lock("pg_advisory_lock_shared", "$1", "$2"),
                    {kTextOid, kTextOid}),
      unlock_interest("SELECT " + interest_lock("pg_advisory_unlock_shared", "$1", "$2"),
                      {kTextOid, kTextOid}),
      renew("UPDATE " + table +
                " SET lease_until = $3 WHERE key = $1 AND token = $2 AND state = 'in_progress'",
            {kTextOid, kInt8Oid, kTimestamptzOid}),
      // One chunk of purge_expired(): the oldest expired results through the expires_at index
      // (planned per run, so a plan made while the table was small is not kept).
      // The outer condition is checked again on the row's latest version, so a key claimed
      // anew since the inner select is never deleted.
      purge_chunk("DELETE FROM " + table + " WHERE key IN (SELECT key FROM " + table +
                      " WHERE state = 'completed' AND expires_at <= $1 ORDER BY expires_at "
                      "LIMIT " +
                      std::to_string(kStorePurgeChunkRows) +
                      ") AND state = 'completed' AND expires_at <= $1",
                  {kTimestamptzOid}, detail::Planning::per_run),
      count_by_state(
          "SELECT "
          "count(*) FILTER (WHERE state = 'in_progress' AND lease_until > $1), "
          "count(*) FILTER (WHERE state = 'in_progress' AND lease_until <= $1), "
          "count(*) FILTER (WHERE state = 'completed' AND expires_at > $1), "
          "count(*) FILTER (WHERE state = 'completed' AND expires_at <= $1) FROM " +
              table,
          {kTimestamptzOid}),
      count("SELECT count(*) FROM " + table, {}),
      // list(): keys in byte order (COLLATE "C", whatever the database's collation), after the
      // cursor ($2), one row more than the page ($3) to know whether another page follows.
      // starts_with() takes the prefix literally (LIKE would read % and _).
      list(
          "SELECT key, state, token, fingerprint, lease_until, took_over, completed_at, "
          "expires_at, NULL::bytea, NULL::text FROM " +
              table +
              " WHERE starts_with(key, $1) AND key COLLATE \"C\" > $2 "
              "ORDER BY key COLLATE \"C\" LIMIT $3",
          {kTextOid, kTextOid, kInt8Oid}),
      remove("WITH gone AS (DELETE FROM " + table +
                 " WHERE key = $1 AND token = $2 RETURNING key) SELECT CASE WHEN " +
                 interest_lock("pg_try_advisory_xact_lock", "$3", "key") +
                 " THEN NULL ELSE pg_notify($3, key) END FROM gone",
             {kTextOid, kInt8Oid, kTextOid}) {}

}  // namespace idem::postgres::detail

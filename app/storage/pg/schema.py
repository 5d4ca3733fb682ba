"""The database schema, as numbered migrations applied once each, in order, at start-up.

:func:`migrate` takes a session advisory lock first, so of several nodes starting at once one
applies what is missing and the others wait, then find nothing left to do. Each migration
runs in its own transaction with its row in ``schema_migrations``: a migration is applied
whole or not at all, and running :func:`migrate` again changes nothing. A migration, once
released, is never edited: a change is a new one at the end.

Text that may hold a NUL character (PostgreSQL ``text`` refuses it) is kept as ``bytea`` of
its UTF-8 (summaries, memory contents) or as JSON, which escapes it (meta, store records).
Ids, paths and names compare in byte order (``COLLATE "C"``), as the tree's SQLite indexes
do, so pages come back in the same order from either backend.
"""

from __future__ import annotations

from typing import Any

import psycopg

MIGRATIONS: tuple[tuple[int, str, str], ...] = (
    (
        1,
        "tasks, turns, artifacts, memory stores, tokens, limits, keys",
        """
CREATE TABLE projects (
    tenant text COLLATE "C" NOT NULL,
    project text COLLATE "C" NOT NULL,
    tasks bigint NOT NULL DEFAULT 0,
    generation bigint NOT NULL DEFAULT 0,
    digest bytea,
    digest_generation bigint NOT NULL DEFAULT -1,
    digest_valid_until_us bigint NOT NULL DEFAULT 0,
    digest_rendered_us bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant, project)
);
CREATE TABLE tasks (
    tenant text COLLATE "C" NOT NULL,
    project text COLLATE "C" NOT NULL,
    task_id text COLLATE "C" NOT NULL,
    owner text,
    created_at text NOT NULL,
    updated_us bigint NOT NULL DEFAULT 0,
    retain_until_us bigint NOT NULL DEFAULT 0,
    turn_count integer NOT NULL DEFAULT 0,
    latest_turn integer,
    min_retain_us bigint NOT NULL DEFAULT 0,
    model text,
    agent_id text,
    exit_code bigint,
    PRIMARY KEY (tenant, project, task_id),
    FOREIGN KEY (tenant, project) REFERENCES projects
);
CREATE INDEX tasks_recent ON tasks (tenant, project, updated_us DESC, task_id DESC);
CREATE INDEX tasks_expiry ON tasks (tenant, project, retain_until_us);
CREATE INDEX tasks_model ON tasks (tenant, project, model, updated_us DESC, task_id DESC);
CREATE INDEX tasks_agent ON tasks (tenant, project, agent_id, updated_us DESC, task_id DESC);
CREATE INDEX tasks_failed ON tasks (tenant, project, updated_us DESC, task_id DESC)
    WHERE exit_code <> 0;
CREATE TABLE turns (
    tenant text COLLATE "C" NOT NULL,
    project text COLLATE "C" NOT NULL,
    task_id text COLLATE "C" NOT NULL,
    turn integer NOT NULL,
    meta text NOT NULL,
    summary bytea NOT NULL,
    created_at text NOT NULL,
    updated_at text NOT NULL,
    retain_until text NOT NULL,
    updated_us bigint NOT NULL,
    retain_until_us bigint NOT NULL,
    model text,
    agent_id text,
    exit_code bigint,
    PRIMARY KEY (tenant, project, task_id, turn),
    FOREIGN KEY (tenant, project, task_id) REFERENCES tasks ON DELETE CASCADE
);
CREATE INDEX turns_expiry ON turns (retain_until_us);
CREATE TABLE artifacts (
    tenant text COLLATE "C" NOT NULL,
    project text COLLATE "C" NOT NULL,
    task_id text COLLATE "C" NOT NULL,
    turn integer NOT NULL,
    name text COLLATE "C" NOT NULL,
    content_type text NOT NULL,
    size bigint NOT NULL,
    sha256 text NOT NULL,
    updated_at text NOT NULL,
    updated_us bigint NOT NULL,
    blob text COLLATE "C" NOT NULL UNIQUE,
    PRIMARY KEY (tenant, project, task_id, turn, name),
    FOREIGN KEY (tenant, project, task_id, turn) REFERENCES turns ON DELETE CASCADE
);
CREATE TABLE stores (
    id text COLLATE "C" PRIMARY KEY,
    tenant text COLLATE "C" NOT NULL,
    project text COLLATE "C" NOT NULL,
    record text NOT NULL,
    created_us bigint NOT NULL,
    archived boolean NOT NULL DEFAULT false,
    last_version_id text COLLATE "C" NOT NULL DEFAULT '',
    last_version_us bigint NOT NULL DEFAULT 0,
    FOREIGN KEY (tenant, project) REFERENCES projects
);
CREATE INDEX stores_recent ON stores (tenant, project, created_us DESC, id DESC);
CREATE TABLE memories (
    store_id text COLLATE "C" NOT NULL REFERENCES stores ON DELETE CASCADE,
    id text COLLATE "C" NOT NULL,
    path text COLLATE "C" NOT NULL,
    head text COLLATE "C" NOT NULL,
    sha text NOT NULL,
    size integer NOT NULL,
    created_at text NOT NULL,
    updated_at text NOT NULL,
    path_since text COLLATE "C" NOT NULL,
    PRIMARY KEY (store_id, id),
    UNIQUE (store_id, path)
);
CREATE TABLE versions (
    store_id text COLLATE "C" NOT NULL REFERENCES stores ON DELETE CASCADE,
    id text COLLATE "C" NOT NULL,
    memory_id text COLLATE "C" NOT NULL,
    operation text NOT NULL,
    path text COLLATE "C",
    content bytea,
    sha text,
    size integer,
    created_by text,
    actor_type text,
    actor_id text,
    created_us bigint NOT NULL,
    created_at text NOT NULL,
    redacted_at text,
    redacted_by text,
    memory_created_at text,
    path_since text,
    previous_version_id text,
    PRIMARY KEY (store_id, id)
);
CREATE INDEX versions_by_memory ON versions (store_id, memory_id, id);
CREATE TABLE tokens (
    id text COLLATE "C" PRIMARY KEY,
    sha256 text NOT NULL UNIQUE,
    role text NOT NULL,
    tenant text,
    project text,
    name text NOT NULL,
    created_at text NOT NULL,
    expires_at text,
    revoked_at text
);
CREATE TABLE limits (
    id integer PRIMARY KEY CHECK (id = 1),
    doc text NOT NULL,
    version bigint NOT NULL
);
CREATE TABLE keys (name text PRIMARY KEY, value bytea NOT NULL);
CREATE TABLE service_state (name text PRIMARY KEY, state text NOT NULL);
""",
    ),
    (
        2,
        "usage counters, quota reservations, requests and bytes per hour",
        """
ALTER TABLE projects
    ADD COLUMN turns bigint NOT NULL DEFAULT 0,
    ADD COLUMN artifacts bigint NOT NULL DEFAULT 0,
    ADD COLUMN artifact_bytes bigint NOT NULL DEFAULT 0,
    ADD COLUMN turn_bytes bigint NOT NULL DEFAULT 0,
    ADD COLUMN stores bigint NOT NULL DEFAULT 0,
    ADD COLUMN memories bigint NOT NULL DEFAULT 0,
    ADD COLUMN memory_bytes bigint NOT NULL DEFAULT 0,
    ADD COLUMN versions bigint NOT NULL DEFAULT 0,
    ADD COLUMN version_bytes bigint NOT NULL DEFAULT 0;
UPDATE projects p SET
    turns = (SELECT count(*) FROM turns t WHERE t.tenant = p.tenant AND t.project = p.project),
    turn_bytes = (SELECT coalesce(sum(octet_length(t.meta) + octet_length(t.summary)), 0)
                  FROM turns t WHERE t.tenant = p.tenant AND t.project = p.project),
    artifacts = (SELECT count(*) FROM artifacts a
                 WHERE a.tenant = p.tenant AND a.project = p.project),
    artifact_bytes = (SELECT coalesce(sum(a.size), 0) FROM artifacts a
                      WHERE a.tenant = p.tenant AND a.project = p.project),
    stores = (SELECT count(*) FROM stores s WHERE s.tenant = p.tenant AND s.project = p.project),
    memories = (SELECT count(*) FROM memories m JOIN stores s ON s.id = m.store_id
                WHERE s.tenant = p.tenant AND s.project = p.project),
    memory_bytes = (SELECT coalesce(sum(m.size), 0) FROM memories m JOIN stores s
                    ON s.id = m.store_id WHERE s.tenant = p.tenant AND s.project = p.project),
    versions = (SELECT count(*) FROM versions v JOIN stores s ON s.id = v.store_id
                WHERE s.tenant = p.tenant AND s.project = p.project),
    version_bytes = (SELECT coalesce(sum(v.size), 0) FROM versions v JOIN stores s
                     ON s.id = v.store_id WHERE s.tenant = p.tenant AND s.project = p.project);
CREATE TABLE usage_reservations (
    id text COLLATE "C" PRIMARY KEY,
    tenant text COLLATE "C" NOT NULL,
    project text COLLATE "C" NOT NULL,
    bytes bigint NOT NULL,
    tasks bigint NOT NULL,
    expires_us bigint NOT NULL
);
CREATE INDEX usage_reservations_by_project ON usage_reservations (tenant, project);
CREATE TABLE traffic (
    hour bigint NOT NULL,
    tenant text COLLATE "C" NOT NULL,
    project text COLLATE "C" NOT NULL,
    token_id text COLLATE "C" NOT NULL,
    requests bigint NOT NULL,
    bytes_in bigint NOT NULL,
    bytes_out bigint NOT NULL,
    PRIMARY KEY (hour, tenant, project, token_id)
);
CREATE INDEX traffic_by_project ON traffic (tenant, project, hour);
""",
    ),
    (
        3,
        "project.md kept as one section per task, replacing the whole rendered digest",
        """
ALTER TABLE projects
    DROP COLUMN generation,
    DROP COLUMN digest,
    DROP COLUMN digest_generation,
    DROP COLUMN digest_valid_until_us,
    DROP COLUMN digest_rendered_us,
    ADD COLUMN digest_rows bigint NOT NULL DEFAULT 0,
    ADD COLUMN digest_shown bigint NOT NULL DEFAULT 0,
    ADD COLUMN digest_bytes bigint NOT NULL DEFAULT 0;
CREATE TABLE digest_sections (
    tenant text COLLATE "C" NOT NULL,
    project text COLLATE "C" NOT NULL,
    task_id text COLLATE "C" NOT NULL,
    turn integer,
    valid_until_us bigint NOT NULL,
    section bytea,
    PRIMARY KEY (tenant, project, task_id),
    FOREIGN KEY (tenant, project, task_id) REFERENCES tasks ON DELETE CASCADE
);
CREATE INDEX digest_sections_expiry ON digest_sections (tenant, project, valid_until_us)
    WHERE section IS NOT NULL;
CREATE FUNCTION digest_sections_counted() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    n bigint := 0;
    shown bigint := 0;
    size bigint := 0;
BEGIN
    IF TG_OP <> 'INSERT' THEN
        n := -1;
        shown := -(OLD.section IS NOT NULL)::int;
        size := -coalesce(octet_length(OLD.section), 0);
    END IF;
    IF TG_OP <> 'DELETE' THEN
        n := n + 1;
        shown := shown + (NEW.section IS NOT NULL)::int;
        size := size + coalesce(octet_length(NEW.section), 0);
    END IF;
    UPDATE projects SET digest_rows = digest_rows + n, digest_shown = digest_shown + shown,
        digest_bytes = digest_bytes + size
    WHERE tenant = coalesce(NEW.tenant, OLD.tenant)
        AND project = coalesce(NEW.project, OLD.project);
    RETURN NULL;
END $$;
CREATE TRIGGER digest_sections_counted AFTER INSERT OR UPDATE OR DELETE ON digest_sections
    FOR EACH ROW EXECUTE FUNCTION digest_sections_counted();
""",
    ),
    (
        4,
        "full-text search: a weighted tsvector of every turn and memory version",
        r"""
-- An exception handler costs a subtransaction for each row written: the functions below
-- enter one only for the rare text that needs it.
--
-- A summary's or memory's UTF-8 as text: each NUL byte (text cannot hold it, and it is never
-- part of a longer UTF-8 sequence) becomes a space. In a database whose encoding cannot hold
-- the text, the text gets no words rather than failing the write.
CREATE FUNCTION search_utf8(data bytea) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
DECLARE
    out text := '';
    rest bytea := data;
    at integer;
BEGIN
    IF getdatabaseencoding() <> 'UTF8' THEN
        BEGIN
            RETURN convert_from(rest, 'UTF8');
        EXCEPTION WHEN untranslatable_character OR character_not_in_repertoire THEN
            RETURN '';
        END;
    END IF;
    LOOP
        at := position('\x00'::bytea IN rest);
        EXIT WHEN at = 0;
        out := out || convert_from(substring(rest FROM 1 FOR at - 1), 'UTF8') || ' ';
        rest := substring(rest FROM at + 1);
    END LOOP;
    RETURN out || convert_from(rest, 'UTF8');
END $$;
-- A turn's meta values (strings and numbers, nested ones too), one a line; keys are left out,
-- they name the same fields in every turn.
CREATE FUNCTION search_meta_values(meta jsonb) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN (SELECT coalesce(string_agg(v #>> '{}', E'\n' ORDER BY n), '')
        FROM jsonb_path_query(meta, 'strict $.**') WITH ORDINALITY AS x(v, n)
        WHERE jsonb_typeof(v) IN ('string', 'number'));
-- jsonb refuses the "\u0000" that JSON text may hold: such a meta is indexed as its JSON
-- text, keys and all, rather than failing the write.
CREATE FUNCTION search_meta(meta text) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
BEGIN
    IF strpos(meta, '\u0000') = 0 THEN
        RETURN search_meta_values(meta::jsonb);
    END IF;
    BEGIN
        RETURN search_meta_values(meta::jsonb);
    EXCEPTION WHEN untranslatable_character OR invalid_text_representation THEN
        RETURN meta;
    END;
END $$;
-- ASCII punctuation splits words, as in the query syntax (fix-login is "fix login"), and
-- never forms the parser's compound tokens (a file path, a URL, an e-mail address are their
-- words). One character for one: offsets in the result are offsets in the text.
CREATE FUNCTION search_words(body text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN translate(body, '!"#$%&''()*+,-./:;<=>?@[\]^_`{|}~', repeat(' ', 32));
-- Words in lower case (the database's LC_CTYPE) and, when the unaccent extension can be
-- installed, without diacritics; no stemming and no stop words, as the tree's FTS5 tokenizer.
CREATE TEXT SEARCH CONFIGURATION search_text (COPY = pg_catalog.simple);
DO $$
DECLARE
    home name;
BEGIN
    CREATE EXTENSION IF NOT EXISTS unaccent;
    SELECT n.nspname INTO home FROM pg_extension e
        JOIN pg_namespace n ON n.oid = e.extnamespace WHERE e.extname = 'unaccent';
    EXECUTE format('ALTER TEXT SEARCH CONFIGURATION search_text ALTER MAPPING FOR word, hword,'
        ' hword_part, numword, numhword, hword_numpart WITH %I.unaccent, simple', home);
EXCEPTION WHEN OTHERS THEN
    -- Not installed on the server, not allowed to this role, or in a schema it cannot use:
    -- search works without it, and diacritics then count.
    RAISE NOTICE 'search without unaccent: %', SQLERRM;
END $$;
-- A turn's words: its task id weighs most (A), then its meta values (B), then its summary (C).
-- A vector holds at most 1 MiB of distinct words: past that, the first part of the longer of
-- meta and summary is indexed, halved until the whole fits (a task id is 128 characters).
CREATE FUNCTION turn_search_vector(task_id text, meta text, summary bytea) RETURNS tsvector
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    name constant tsvector := setweight(to_tsvector('search_text', search_words(task_id)), 'A');
    meta_words text := search_words(search_meta(meta));
    body text := search_words(search_utf8(summary));
BEGIN
    IF octet_length(meta) + octet_length(summary) < 262144 THEN
        RETURN name || setweight(to_tsvector('search_text', meta_words), 'B')
            || setweight(to_tsvector('search_text', body), 'C');
    END IF;
    LOOP
        BEGIN
            RETURN name || setweight(to_tsvector('search_text', meta_words), 'B')
                || setweight(to_tsvector('search_text', body), 'C');
        EXCEPTION WHEN program_limit_exceeded THEN
            IF length(body) >= length(meta_words) THEN
                body := left(body, length(body) / 2);
            ELSE
                meta_words := left(meta_words, length(meta_words) / 2);
            END IF;
        END;
    END LOOP;
END $$;
-- A memory version's words: its path weighs most (A), then its content (C); a redacted
-- version has none. A content is at most 100 KiB: its vector is never too large.
CREATE FUNCTION memory_search_vector(path text, content bytea) RETURNS tsvector
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN setweight(to_tsvector('search_text', search_words(coalesce(path, ''))), 'A')
    || setweight(to_tsvector('search_text', search_words(coalesce(search_utf8(content), ''))),
                 'C');
-- Generated columns: every write path keeps them without knowing of them. A memory's text is
-- its head version's (its memories row names it), so the vector is on the versions.
ALTER TABLE turns ADD COLUMN search tsvector
    GENERATED ALWAYS AS (turn_search_vector(task_id, meta, summary)) STORED;
CREATE INDEX turns_search ON turns USING gin (search);
ALTER TABLE versions ADD COLUMN search tsvector
    GENERATED ALWAYS AS (memory_search_vector(path, content)) STORED;
CREATE INDEX versions_search ON versions USING gin (search);
""",
    ),
    (
        5,
        "tokens: when the console was last signed out with each",
        """
ALTER TABLE tokens ADD COLUMN console_signed_out_at text;
""",
    ),
    (
        6,
        "tasks: their bytes; the task list ordered by size and by turn count",
        """
ALTER TABLE tasks ADD COLUMN bytes bigint NOT NULL DEFAULT 0;
UPDATE tasks t SET bytes =
    (SELECT coalesce(sum(octet_length(u.meta) + octet_length(u.summary)), 0) FROM turns u
     WHERE u.tenant = t.tenant AND u.project = t.project AND u.task_id = t.task_id)
    + (SELECT coalesce(sum(a.size), 0) FROM artifacts a
       WHERE a.tenant = t.tenant AND a.project = t.project AND a.task_id = t.task_id);
CREATE INDEX tasks_size ON tasks (tenant, project, bytes DESC, task_id DESC);
CREATE INDEX tasks_turns ON tasks (tenant, project, turn_count DESC, task_id DESC);
""",
    ),
    (
        7,
        "the audit log: who did what in each project",
        """
CREATE TABLE audit_events (
    id text COLLATE "C" PRIMARY KEY,
    at_us bigint NOT NULL,
    tenant text COLLATE "C" NOT NULL,
    project text COLLATE "C",
    actor text COLLATE "C",
    kind text NOT NULL,
    action text NOT NULL,
    subject text NOT NULL,
    store_id text COLLATE "C",
    detail text NOT NULL
);
CREATE INDEX audit_events_by_project ON audit_events (tenant, project, at_us DESC, id DESC);
CREATE INDEX audit_events_by_age ON audit_events (at_us);
""",
    ),
    (
        8,
        "the objects an artifact's earlier uploads left, so that deleting it removes them",
        """
CREATE TABLE superseded_blobs (
    tenant text COLLATE "C" NOT NULL,
    project text COLLATE "C" NOT NULL,
    task_id text COLLATE "C" NOT NULL,
    turn integer NOT NULL,
    name text COLLATE "C" NOT NULL,
    blob text COLLATE "C" PRIMARY KEY,
    superseded_us bigint NOT NULL,
    FOREIGN KEY (tenant, project, task_id, turn, name) REFERENCES artifacts ON DELETE CASCADE
);
CREATE INDEX superseded_blobs_of ON superseded_blobs (tenant, project, task_id, turn, name);
""",
    ),
    (
        9,
        "OAuth grants and dynamically registered clients (core/oauth.py)",
        """
CREATE TABLE oauth_grants (
    id text COLLATE "C" PRIMARY KEY,
    token_id text COLLATE "C" NOT NULL,
    record text NOT NULL
);
CREATE INDEX oauth_grants_by_token ON oauth_grants (token_id);
CREATE TABLE oauth_clients (
    id text COLLATE "C" PRIMARY KEY,
    registered_from text NOT NULL,
    created_at text NOT NULL,
    record text NOT NULL
);
CREATE INDEX oauth_clients_by_address ON oauth_clients (registered_from, created_at);
""",
    ),
    (
        10,
        "the turn ledger: each turn's tokens, cost and times, and their sums by day and key",
        r"""
-- Each turn's entry (core/ledger.py entry_of), written with the turn and gone with it.
CREATE TABLE ledger_turns (
    tenant text COLLATE "C" NOT NULL,
    project text COLLATE "C" NOT NULL,
    task_id text COLLATE "C" NOT NULL,
    turn integer NOT NULL,
    at_us bigint NOT NULL,
    day integer NOT NULL,
    agent text COLLATE "C" NOT NULL,
    model text COLLATE "C" NOT NULL,
    branch text COLLATE "C" NOT NULL,
    session text COLLATE "C" NOT NULL,
    git_commit text NOT NULL,
    input_tokens bigint NOT NULL,
    output_tokens bigint NOT NULL,
    cache_read_tokens bigint NOT NULL,
    cache_creation_tokens bigint NOT NULL,
    cost_nusd bigint,
    wall_us bigint NOT NULL,
    exit_code bigint,
    PRIMARY KEY (tenant, project, task_id, turn),
    FOREIGN KEY (tenant, project, task_id, turn) REFERENCES turns ON DELETE CASCADE
);
-- The timeline, newest first, whole or of one agent, model or branch.
CREATE INDEX ledger_turns_recent ON ledger_turns
    (tenant, project, at_us DESC, task_id DESC, turn DESC);
CREATE INDEX ledger_turns_agent ON ledger_turns
    (tenant, project, agent, at_us DESC, task_id DESC, turn DESC);
CREATE INDEX ledger_turns_model ON ledger_turns
    (tenant, project, model, at_us DESC, task_id DESC, turn DESC);
CREATE INDEX ledger_turns_branch ON ledger_turns
    (tenant, project, branch, at_us DESC, task_id DESC, turn DESC);
-- A session's first turn, when one of its turns changes.
CREATE INDEX ledger_turns_session ON ledger_turns (tenant, project, session, at_us, task_id, turn)
    WHERE session <> '';
-- The sums by day, agent and model (every total and grouping of those three, a few rows a day).
CREATE TABLE ledger_models (
    tenant text COLLATE "C" NOT NULL,
    project text COLLATE "C" NOT NULL,
    day integer NOT NULL,
    agent text COLLATE "C" NOT NULL,
    model text COLLATE "C" NOT NULL,
    turns bigint NOT NULL DEFAULT 0,
    input_tokens bigint NOT NULL DEFAULT 0,
    output_tokens bigint NOT NULL DEFAULT 0,
    cache_read_tokens bigint NOT NULL DEFAULT 0,
    cache_creation_tokens bigint NOT NULL DEFAULT 0,
    cost_nusd bigint NOT NULL DEFAULT 0,
    costed_turns bigint NOT NULL DEFAULT 0,
    open_input_tokens bigint NOT NULL DEFAULT 0,
    open_output_tokens bigint NOT NULL DEFAULT 0,
    open_cache_read_tokens bigint NOT NULL DEFAULT 0,
    open_cache_creation_tokens bigint NOT NULL DEFAULT 0,
    wall_us bigint NOT NULL DEFAULT 0,
    nonzero_exits bigint NOT NULL DEFAULT 0,
    sessions bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant, project, day, model, agent)
);
-- The sums by day, agent, model and branch (every grouping of those four).
CREATE TABLE ledger (
    tenant text COLLATE "C" NOT NULL,
    project text COLLATE "C" NOT NULL,
    day integer NOT NULL,
    agent text COLLATE "C" NOT NULL,
    model text COLLATE "C" NOT NULL,
    branch text COLLATE "C" NOT NULL,
    turns bigint NOT NULL DEFAULT 0,
    input_tokens bigint NOT NULL DEFAULT 0,
    output_tokens bigint NOT NULL DEFAULT 0,
    cache_read_tokens bigint NOT NULL DEFAULT 0,
    cache_creation_tokens bigint NOT NULL DEFAULT 0,
    cost_nusd bigint NOT NULL DEFAULT 0,
    costed_turns bigint NOT NULL DEFAULT 0,
    open_input_tokens bigint NOT NULL DEFAULT 0,
    open_output_tokens bigint NOT NULL DEFAULT 0,
    open_cache_read_tokens bigint NOT NULL DEFAULT 0,
    open_cache_creation_tokens bigint NOT NULL DEFAULT 0,
    wall_us bigint NOT NULL DEFAULT 0,
    nonzero_exits bigint NOT NULL DEFAULT 0,
    sessions bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant, project, day, agent, model, branch)
);
-- The sums by task and session as well (the groupings by task or session).
CREATE TABLE ledger_tasks (
    tenant text COLLATE "C" NOT NULL,
    project text COLLATE "C" NOT NULL,
    task_id text COLLATE "C" NOT NULL,
    session text COLLATE "C" NOT NULL,
    day integer NOT NULL,
    agent text COLLATE "C" NOT NULL,
    model text COLLATE "C" NOT NULL,
    branch text COLLATE "C" NOT NULL,
    turns bigint NOT NULL DEFAULT 0,
    input_tokens bigint NOT NULL DEFAULT 0,
    output_tokens bigint NOT NULL DEFAULT 0,
    cache_read_tokens bigint NOT NULL DEFAULT 0,
    cache_creation_tokens bigint NOT NULL DEFAULT 0,
    cost_nusd bigint NOT NULL DEFAULT 0,
    costed_turns bigint NOT NULL DEFAULT 0,
    open_input_tokens bigint NOT NULL DEFAULT 0,
    open_output_tokens bigint NOT NULL DEFAULT 0,
    open_cache_read_tokens bigint NOT NULL DEFAULT 0,
    open_cache_creation_tokens bigint NOT NULL DEFAULT 0,
    wall_us bigint NOT NULL DEFAULT 0,
    nonzero_exits bigint NOT NULL DEFAULT 0,
    sessions bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant, project, task_id, session, day, agent, model, branch)
);
CREATE INDEX ledger_tasks_day ON ledger_tasks (tenant, project, day);
CREATE INDEX ledger_tasks_session ON ledger_tasks (tenant, project, session, task_id);
-- Where each session is counted: its first turn (earliest at_us, then task id, then turn).
CREATE TABLE ledger_sessions (
    tenant text COLLATE "C" NOT NULL,
    project text COLLATE "C" NOT NULL,
    session text COLLATE "C" NOT NULL,
    at_us bigint NOT NULL,
    task_id text COLLATE "C" NOT NULL,
    turn integer NOT NULL,
    day integer NOT NULL,
    agent text COLLATE "C" NOT NULL,
    model text COLLATE "C" NOT NULL,
    branch text COLLATE "C" NOT NULL,
    PRIMARY KEY (tenant, project, session)
);
-- Move the sums of one entry's rows by its figures times ``sign``.
CREATE FUNCTION ledger_move(r ledger_turns, sign integer) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    costed constant integer := (r.cost_nusd IS NOT NULL)::integer;
    open_ constant integer := sign * (1 - costed);
    failed constant integer := (coalesce(r.exit_code, 0) <> 0)::integer;
BEGIN
    INSERT INTO ledger_models AS c (tenant, project, day, agent, model,
        turns, input_tokens, output_tokens, cache_read_tokens, cache_creation_tokens,
        cost_nusd, costed_turns, open_input_tokens, open_output_tokens,
        open_cache_read_tokens, open_cache_creation_tokens, wall_us, nonzero_exits)
    VALUES (r.tenant, r.project, r.day, r.agent, r.model,
        sign, sign * r.input_tokens, sign * r.output_tokens, sign * r.cache_read_tokens,
        sign * r.cache_creation_tokens, sign * coalesce(r.cost_nusd, 0), sign * costed,
        open_ * r.input_tokens, open_ * r.output_tokens, open_ * r.cache_read_tokens,
        open_ * r.cache_creation_tokens, sign * r.wall_us, sign * failed)
    ON CONFLICT (tenant, project, day, model, agent) DO UPDATE SET
        turns = c.turns + excluded.turns,
        input_tokens = c.input_tokens + excluded.input_tokens,
        output_tokens = c.output_tokens + excluded.output_tokens,
        cache_read_tokens = c.cache_read_tokens + excluded.cache_read_tokens,
        cache_creation_tokens = c.cache_creation_tokens + excluded.cache_creation_tokens,
        cost_nusd = c.cost_nusd + excluded.cost_nusd,
        costed_turns = c.costed_turns + excluded.costed_turns,
        open_input_tokens = c.open_input_tokens + excluded.open_input_tokens,
        open_output_tokens = c.open_output_tokens + excluded.open_output_tokens,
        open_cache_read_tokens = c.open_cache_read_tokens + excluded.open_cache_read_tokens,
        open_cache_creation_tokens
            = c.open_cache_creation_tokens + excluded.open_cache_creation_tokens,
        wall_us = c.wall_us + excluded.wall_us,
        nonzero_exits = c.nonzero_exits + excluded.nonzero_exits;
    INSERT INTO ledger AS c (tenant, project, day, agent, model, branch,
        turns, input_tokens, output_tokens, cache_read_tokens, cache_creation_tokens,
        cost_nusd, costed_turns, open_input_tokens, open_output_tokens,
        open_cache_read_tokens, open_cache_creation_tokens, wall_us, nonzero_exits)
    VALUES (r.tenant, r.project, r.day, r.agent, r.model, r.branch,
        sign, sign * r.input_tokens, sign * r.output_tokens, sign * r.cache_read_tokens,
        sign * r.cache_creation_tokens, sign * coalesce(r.cost_nusd, 0), sign * costed,
        open_ * r.input_tokens, open_ * r.output_tokens, open_ * r.cache_read_tokens,
        open_ * r.cache_creation_tokens, sign * r.wall_us, sign * failed)
    ON CONFLICT (tenant, project, day, agent, model, branch) DO UPDATE SET
        turns = c.turns + excluded.turns,
        input_tokens = c.input_tokens + excluded.input_tokens,
        output_tokens = c.output_tokens + excluded.output_tokens,
        cache_read_tokens = c.cache_read_tokens + excluded.cache_read_tokens,
        cache_creation_tokens = c.cache_creation_tokens + excluded.cache_creation_tokens,
        cost_nusd = c.cost_nusd + excluded.cost_nusd,
        costed_turns = c.costed_turns + excluded.costed_turns,
        open_input_tokens = c.open_input_tokens + excluded.open_input_tokens,
        open_output_tokens = c.open_output_tokens + excluded.open_output_tokens,
        open_cache_read_tokens = c.open_cache_read_tokens + excluded.open_cache_read_tokens,
        open_cache_creation_tokens
            = c.open_cache_creation_tokens + excluded.open_cache_creation_tokens,
        wall_us = c.wall_us + excluded.wall_us,
        nonzero_exits = c.nonzero_exits + excluded.nonzero_exits;
    INSERT INTO ledger_tasks AS c (tenant, project, task_id, session, day, agent, model, branch,
        turns, input_tokens, output_tokens, cache_read_tokens, cache_creation_tokens,
        cost_nusd, costed_turns, open_input_tokens, open_output_tokens,
        open_cache_read_tokens, open_cache_creation_tokens, wall_us, nonzero_exits)
    VALUES (r.tenant, r.project, r.task_id, r.session, r.day, r.agent, r.model, r.branch,
        sign, sign * r.input_tokens, sign * r.output_tokens, sign * r.cache_read_tokens,
        sign * r.cache_creation_tokens, sign * coalesce(r.cost_nusd, 0), sign * costed,
        open_ * r.input_tokens, open_ * r.output_tokens, open_ * r.cache_read_tokens,
        open_ * r.cache_creation_tokens, sign * r.wall_us, sign * failed)
    ON CONFLICT (tenant, project, task_id, session, day, agent, model, branch) DO UPDATE SET
        turns = c.turns + excluded.turns,
        input_tokens = c.input_tokens + excluded.input_tokens,
        output_tokens = c.output_tokens + excluded.output_tokens,
        cache_read_tokens = c.cache_read_tokens + excluded.cache_read_tokens,
        cache_creation_tokens = c.cache_creation_tokens + excluded.cache_creation_tokens,
        cost_nusd = c.cost_nusd + excluded.cost_nusd,
        costed_turns = c.costed_turns + excluded.costed_turns,
        open_input_tokens = c.open_input_tokens + excluded.open_input_tokens,
        open_output_tokens = c.open_output_tokens + excluded.open_output_tokens,
        open_cache_read_tokens = c.open_cache_read_tokens + excluded.open_cache_read_tokens,
        open_cache_creation_tokens
            = c.open_cache_creation_tokens + excluded.open_cache_creation_tokens,
        wall_us = c.wall_us + excluded.wall_us,
        nonzero_exits = c.nonzero_exits + excluded.nonzero_exits;
END $$;
-- Count session ``s`` in the rows of its first turn, and nowhere else.
CREATE FUNCTION ledger_settle_home(t text, p text, s text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    was ledger_sessions%ROWTYPE;
    had boolean;
    home record;
    has boolean;
BEGIN
    SELECT * INTO was FROM ledger_sessions h
    WHERE h.tenant = t AND h.project = p AND h.session = s;
    had := FOUND;
    SELECT u.at_us, u.task_id, u.turn, u.day, u.agent, u.model, u.branch INTO home
    FROM ledger_turns u WHERE u.tenant = t AND u.project = p AND u.session = s
    ORDER BY u.at_us, u.task_id, u.turn LIMIT 1;
    has := FOUND;
    IF had AND has AND (was.at_us, was.task_id, was.turn, was.day, was.agent, was.model,
        was.branch) = (home.at_us, home.task_id, home.turn, home.day, home.agent, home.model,
        home.branch) THEN
        RETURN;
    END IF;
    IF had THEN
        UPDATE ledger_models c SET sessions = c.sessions - 1 WHERE c.tenant = t
            AND c.project = p AND c.day = was.day AND c.agent = was.agent
            AND c.model = was.model;
        UPDATE ledger c SET sessions = c.sessions - 1 WHERE c.tenant = t AND c.project = p
            AND c.day = was.day AND c.agent = was.agent AND c.model = was.model
            AND c.branch = was.branch;
        UPDATE ledger_tasks c SET sessions = c.sessions - 1 WHERE c.tenant = t
            AND c.project = p AND c.task_id = was.task_id AND c.session = s
            AND c.day = was.day AND c.agent = was.agent AND c.model = was.model
            AND c.branch = was.branch;
        DELETE FROM ledger_sessions h WHERE h.tenant = t AND h.project = p AND h.session = s;
    END IF;
    IF has THEN
        UPDATE ledger_models c SET sessions = c.sessions + 1 WHERE c.tenant = t
            AND c.project = p AND c.day = home.day AND c.agent = home.agent
            AND c.model = home.model;
        UPDATE ledger c SET sessions = c.sessions + 1 WHERE c.tenant = t AND c.project = p
            AND c.day = home.day AND c.agent = home.agent AND c.model = home.model
            AND c.branch = home.branch;
        UPDATE ledger_tasks c SET sessions = c.sessions + 1 WHERE c.tenant = t
            AND c.project = p AND c.task_id = home.task_id AND c.session = s
            AND c.day = home.day AND c.agent = home.agent AND c.model = home.model
            AND c.branch = home.branch;
        INSERT INTO ledger_sessions VALUES (t, p, s, home.at_us, home.task_id, home.turn,
            home.day, home.agent, home.model, home.branch);
    END IF;
END $$;
-- Every change of an entry (a write, a delete, a cascade from its turn or task) moves the
-- sums in its own transaction. It first holds the project's row, as the usage counters do:
-- writers of one project change the rows they share one at a time, never in an order that
-- could deadlock.
CREATE FUNCTION ledger_turns_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM projects WHERE tenant = coalesce(NEW.tenant, OLD.tenant)
        AND project = coalesce(NEW.project, OLD.project) FOR NO KEY UPDATE;
    IF TG_OP <> 'INSERT' THEN
        PERFORM ledger_move(OLD, -1);
    END IF;
    IF TG_OP <> 'DELETE' THEN
        PERFORM ledger_move(NEW, 1);
    END IF;
    IF TG_OP <> 'INSERT' AND OLD.session <> '' THEN
        PERFORM ledger_settle_home(OLD.tenant, OLD.project, OLD.session);
    END IF;
    IF TG_OP <> 'DELETE' AND NEW.session <> ''
        AND (TG_OP = 'INSERT' OR NEW.session <> OLD.session) THEN
        PERFORM ledger_settle_home(NEW.tenant, NEW.project, NEW.session);
    END IF;
    IF TG_OP <> 'INSERT' THEN
        -- Rows left with no turn go (a session is counted only where it has one).
        DELETE FROM ledger_models c WHERE c.tenant = OLD.tenant AND c.project = OLD.project
            AND c.day = OLD.day AND c.agent = OLD.agent AND c.model = OLD.model
            AND c.turns = 0;
        DELETE FROM ledger c WHERE c.tenant = OLD.tenant AND c.project = OLD.project
            AND c.day = OLD.day AND c.agent = OLD.agent AND c.model = OLD.model
            AND c.branch = OLD.branch AND c.turns = 0;
        DELETE FROM ledger_tasks c WHERE c.tenant = OLD.tenant AND c.project = OLD.project
            AND c.task_id = OLD.task_id AND c.session = OLD.session AND c.day = OLD.day
            AND c.agent = OLD.agent AND c.model = OLD.model AND c.branch = OLD.branch
            AND c.turns = 0;
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER ledger_turns_changed AFTER INSERT OR UPDATE OR DELETE ON ledger_turns
    FOR EACH ROW EXECUTE FUNCTION ledger_turns_changed();
""",
    ),
    (
        11,
        "users signed in through an identity provider, and the user each token acts for",
        """
CREATE TABLE users (
    id text COLLATE "C" PRIMARY KEY,
    issuer text NOT NULL,
    subject text NOT NULL,
    record text NOT NULL
);
ALTER TABLE tokens ADD COLUMN user_id text COLLATE "C";
CREATE INDEX tokens_by_user ON tokens (user_id) WHERE user_id IS NOT NULL;
""",
    ),
    (
        12,
        "vectors beside the search text: chunk vectors, the embedding queue, their change log",
        r"""
-- Which text of a turn, or of a memory's head version, is embedded with which model: a row
-- per text, queued (its text changed: gen counts the changes, so a worker that embedded an
-- older text stores nothing) or embedded (model). Written by the triggers below in the
-- transaction that writes the text; gone with the row (ON DELETE CASCADE).
CREATE TABLE turn_embeds (
    tenant text COLLATE "C" NOT NULL,
    project text COLLATE "C" NOT NULL,
    task_id text COLLATE "C" NOT NULL,
    turn integer NOT NULL,
    gen bigint NOT NULL DEFAULT 1,
    queued boolean NOT NULL DEFAULT true,
    model text,
    PRIMARY KEY (tenant, project, task_id, turn),
    FOREIGN KEY (tenant, project, task_id, turn) REFERENCES turns ON DELETE CASCADE
);
CREATE INDEX turn_embeds_queued ON turn_embeds (tenant, project) WHERE queued;
CREATE TABLE memory_embeds (
    store_id text COLLATE "C" NOT NULL,
    version_id text COLLATE "C" NOT NULL,
    tenant text COLLATE "C" NOT NULL,
    project text COLLATE "C" NOT NULL,
    gen bigint NOT NULL DEFAULT 1,
    queued boolean NOT NULL DEFAULT true,
    model text,
    PRIMARY KEY (store_id, version_id),
    FOREIGN KEY (store_id, version_id) REFERENCES versions ON DELETE CASCADE
);
CREATE INDEX memory_embeds_queued ON memory_embeds (tenant, project) WHERE queued;
-- One row per chunk: little-endian float32 bytes and the model key they were made with.
-- ``id`` names one embedding of one text (all its chunks); a new text gets a new id.
CREATE SEQUENCE vector_ids;
CREATE TABLE turn_vectors (
    tenant text COLLATE "C" NOT NULL,
    project text COLLATE "C" NOT NULL,
    task_id text COLLATE "C" NOT NULL,
    turn integer NOT NULL,
    ordinal integer NOT NULL,
    id bigint NOT NULL,
    model text NOT NULL,
    vec bytea NOT NULL,
    PRIMARY KEY (tenant, project, task_id, turn, ordinal),
    FOREIGN KEY (tenant, project, task_id, turn) REFERENCES turns ON DELETE CASCADE
);
CREATE INDEX turn_vectors_ids ON turn_vectors (tenant, project, id);
CREATE TABLE memory_vectors (
    store_id text COLLATE "C" NOT NULL,
    version_id text COLLATE "C" NOT NULL,
    ordinal integer NOT NULL,
    tenant text COLLATE "C" NOT NULL,
    project text COLLATE "C" NOT NULL,
    id bigint NOT NULL,
    model text NOT NULL,
    vec bytea NOT NULL,
    PRIMARY KEY (store_id, version_id, ordinal),
    FOREIGN KEY (store_id, version_id) REFERENCES versions ON DELETE CASCADE
);
CREATE INDEX memory_vectors_ids ON memory_vectors (tenant, project, id);
-- The change log the workers' resident matrices follow (core/resident.py): the id of each
-- embedding stored or dropped, numbered per project at commit (a deferred trigger takes the
-- project's vector_heads row last), so the numbers follow the commit order and a reader
-- that saw number n saw every change up to n.
CREATE TABLE vector_heads (
    tenant text COLLATE "C" NOT NULL,
    project text COLLATE "C" NOT NULL,
    seq bigint NOT NULL,
    PRIMARY KEY (tenant, project)
);
CREATE TABLE vector_changes (
    tenant text COLLATE "C" NOT NULL,
    project text COLLATE "C" NOT NULL,
    id bigint NOT NULL,
    xid xid8 NOT NULL DEFAULT pg_current_xact_id(),
    seq bigint
);
CREATE INDEX vector_changes_seq ON vector_changes (tenant, project, seq);
CREATE INDEX vector_changes_unnumbered ON vector_changes (tenant, project, xid)
    WHERE seq IS NULL;

CREATE FUNCTION vectors_changed() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    IF TG_OP = 'DELETE' THEN r := OLD; ELSE r := NEW; END IF;
    IF r.ordinal = 0 THEN
        INSERT INTO vector_changes (tenant, project, id) VALUES (r.tenant, r.project, r.id);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER turn_vectors_changed AFTER INSERT OR DELETE ON turn_vectors
    FOR EACH ROW EXECUTE FUNCTION vectors_changed();
CREATE TRIGGER memory_vectors_changed AFTER INSERT OR DELETE ON memory_vectors
    FOR EACH ROW EXECUTE FUNCTION vectors_changed();

CREATE FUNCTION vector_changes_numbered() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    n bigint;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM vector_changes WHERE tenant = NEW.tenant
            AND project = NEW.project AND seq IS NULL AND xid = pg_current_xact_id()) THEN
        RETURN NULL;  -- numbered by an earlier event of this transaction
    END IF;
    INSERT INTO vector_heads AS h (tenant, project, seq) VALUES (NEW.tenant, NEW.project, 1)
        ON CONFLICT (tenant, project) DO UPDATE SET seq = h.seq + 1
        RETURNING h.seq INTO n;
    UPDATE vector_changes SET seq = n WHERE tenant = NEW.tenant AND project = NEW.project
        AND seq IS NULL AND xid = pg_current_xact_id();
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER vector_changes_numbered AFTER INSERT ON vector_changes
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION vector_changes_numbered();

-- A turn's text written: queued (its old vectors go).
CREATE FUNCTION turns_text_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO turn_embeds AS e (tenant, project, task_id, turn)
        VALUES (NEW.tenant, NEW.project, NEW.task_id, NEW.turn)
        ON CONFLICT (tenant, project, task_id, turn)
        DO UPDATE SET gen = e.gen + 1, queued = true, model = NULL;
    IF TG_OP = 'UPDATE' THEN
        DELETE FROM turn_vectors WHERE tenant = NEW.tenant AND project = NEW.project
            AND task_id = NEW.task_id AND turn = NEW.turn;
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER turns_text_written AFTER INSERT ON turns
    FOR EACH ROW EXECUTE FUNCTION turns_text_changed();
CREATE TRIGGER turns_text_changed AFTER UPDATE OF meta, summary ON turns
    FOR EACH ROW WHEN (OLD.meta IS DISTINCT FROM NEW.meta
        OR OLD.summary IS DISTINCT FROM NEW.summary)
    EXECUTE FUNCTION turns_text_changed();

-- A memory's head: its text is embedded; a head that moves on or goes takes its vectors.
CREATE FUNCTION memories_head_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP <> 'INSERT' THEN
        DELETE FROM memory_embeds WHERE store_id = OLD.store_id AND version_id = OLD.head;
        DELETE FROM memory_vectors WHERE store_id = OLD.store_id AND version_id = OLD.head;
    END IF;
    IF TG_OP <> 'DELETE' THEN
        INSERT INTO memory_embeds AS e (store_id, version_id, tenant, project)
            SELECT NEW.store_id, NEW.head, s.tenant, s.project FROM stores s
            WHERE s.id = NEW.store_id
            ON CONFLICT (store_id, version_id)
            DO UPDATE SET gen = e.gen + 1, queued = true, model = NULL;
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER memories_head_changed AFTER INSERT OR DELETE OR UPDATE OF head ON memories
    FOR EACH ROW EXECUTE FUNCTION memories_head_changed();

-- A version's content removed (a redaction): its vectors go now; a head is embedded again
-- from what is left.
CREATE FUNCTION versions_content_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM memory_vectors WHERE store_id = NEW.store_id AND version_id = NEW.id;
    UPDATE memory_embeds SET gen = gen + 1, queued = true, model = NULL
        WHERE store_id = NEW.store_id AND version_id = NEW.id;
    RETURN NULL;
END $$;
CREATE TRIGGER versions_content_changed AFTER UPDATE OF path, content ON versions
    FOR EACH ROW WHEN (OLD.content IS DISTINCT FROM NEW.content
        OR OLD.path IS DISTINCT FROM NEW.path)
    EXECUTE FUNCTION versions_content_changed();

-- What is there already waits to be embedded.
INSERT INTO turn_embeds (tenant, project, task_id, turn)
    SELECT tenant, project, task_id, turn FROM turns;
INSERT INTO memory_embeds (store_id, version_id, tenant, project)
    SELECT m.store_id, m.head, s.tenant, s.project
    FROM memories m JOIN stores s ON s.id = m.store_id;
""",
    ),
)


def _lock_text(conn: psycopg.Connection[Any]) -> str:
    row = conn.execute("SELECT current_schema()").fetchone()
    return f"project-memory migrations {row[0] if row else ''}"


def migrate(conn: psycopg.Connection[Any]) -> list[str]:
    """Apply every migration the database lacks; return a line for each one applied.

    ``conn`` is in autocommit mode: the advisory lock is the session's, held across the
    migrations' own transactions.
    """
    applied: list[str] = []
    text = _lock_text(conn)
    conn.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))", (text,))
    try:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            " version integer PRIMARY KEY, description text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        done = {r[0] for r in conn.execute("SELECT version FROM schema_migrations")}
        for version, description, sql in MIGRATIONS:
            if version in done:
                continue
            with conn.transaction():
                conn.execute(sql.encode())
                conn.execute(
                    "INSERT INTO schema_migrations (version, description) VALUES (%s, %s)",
                    (version, description),
                )
            applied.append(f"database schema migration {version} applied: {description}")
    finally:
        conn.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", (text,))
    return applied

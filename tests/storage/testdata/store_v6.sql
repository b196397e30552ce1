-- A store at schema version 6: store_v5.sql opened by aotid at schema 6
-- (commit edbe246, `aotid ls`), which migrated it; so the same models,
-- builds and events, in schema 6's tables. Made with `sqlite3 aotid.db
-- .dump`; the migration test loads it and opens it with the current binary.
-- Never edit it: add a store_vN.sql for each new schema version instead.
-- (.dump leaves out PRAGMA user_version; the line below restores it.)
PRAGMA user_version=6;
PRAGMA foreign_keys=OFF;
BEGIN TRANSACTION;
CREATE TABLE artifacts(
      sha256 TEXT PRIMARY KEY CHECK(length(sha256) = 64),
      kind TEXT NOT NULL,
      size INTEGER NOT NULL,
      added_at_ms INTEGER NOT NULL);
INSERT INTO artifacts VALUES('5e47cc982ef8d45c39c9ee51902ad95830b5aa6298d98246972ee34ff661bbee','exported_program',12543,1796236921623);
INSERT INTO artifacts VALUES('ef31eec8f571d5d134b3e51bb9581485b5f5fe745f61a36440de1245392a12e8','exported_program',9792,1796236921665);
CREATE TABLE models(
      id INTEGER PRIMARY KEY,
      name TEXT NOT NULL UNIQUE,
      created_at_ms INTEGER NOT NULL, version_policy TEXT NOT NULL DEFAULT 'latest', enabled INTEGER NOT NULL DEFAULT 1 CHECK(enabled IN (0, 1)));
INSERT INTO models VALUES(1,'mlp',1796236921623,'latest',1);
INSERT INTO models VALUES(2,'embed',1796236921665,'latest',1);
CREATE TABLE versions(
      model_id INTEGER NOT NULL REFERENCES models(id) ON DELETE CASCADE,
      version INTEGER NOT NULL CHECK(version >= 1),
      artifact TEXT NOT NULL REFERENCES artifacts(sha256),
      package_model TEXT NOT NULL DEFAULT 'model',
      device TEXT NOT NULL DEFAULT 'auto',
      num_runners INTEGER NOT NULL DEFAULT 1,
      created_at_ms INTEGER NOT NULL, fallback_cpu INTEGER NOT NULL DEFAULT 1
      CHECK(fallback_cpu IN (0, 1)), max_batch_size INTEGER NOT NULL DEFAULT 1
      CHECK(max_batch_size >= 1), max_batch_delay_us INTEGER NOT NULL DEFAULT 0
      CHECK(max_batch_delay_us >= 0), threads INTEGER NOT NULL DEFAULT 0 CHECK(threads >= 0), inductor_options TEXT NOT NULL DEFAULT '', timeout_s INTEGER NOT NULL DEFAULT 0 CHECK(timeout_s >= 0), memory_limit_mb INTEGER NOT NULL DEFAULT 0 CHECK(memory_limit_mb >= 0), max_sequences INTEGER NOT NULL DEFAULT 0 CHECK(max_sequences >= 0),
      PRIMARY KEY(model_id, version));
INSERT INTO versions VALUES(1,1,'5e47cc982ef8d45c39c9ee51902ad95830b5aa6298d98246972ee34ff661bbee','model','auto',1,1796236921623,1,1,0,0,'',0,0,0);
INSERT INTO versions VALUES(1,5,'5e47cc982ef8d45c39c9ee51902ad95830b5aa6298d98246972ee34ff661bbee','model','auto',1,1796236921646,1,1,0,0,'',0,0,0);
INSERT INTO versions VALUES(2,1,'ef31eec8f571d5d134b3e51bb9581485b5f5fe745f61a36440de1245392a12e8','model','auto',2,1796236921665,1,1,0,0,'',0,0,0);
CREATE TABLE events(
      id INTEGER PRIMARY KEY AUTOINCREMENT,
      at_ms INTEGER NOT NULL,
      model TEXT NOT NULL DEFAULT '',
      version INTEGER NOT NULL DEFAULT 0,
      kind TEXT NOT NULL,
      message TEXT NOT NULL);
INSERT INTO events VALUES(1,1796236921624,'mlp',1,'added','added m/mlp.pt2 as sha256:5e47cc982ef8');
INSERT INTO events VALUES(2,1796236921646,'mlp',5,'added','added m/mlp.pt2 as sha256:5e47cc982ef8');
INSERT INTO events VALUES(3,1796236921665,'embed',1,'added','added m/embed.pt2 as sha256:ef31eec8f571');
INSERT INTO events VALUES(4,1796236921702,'embed',1,'build_queued','queued for a build for cpu');
INSERT INTO events VALUES(5,1796236921707,'embed',1,'build_started','compiling for cpu on linux-x86_64-avx2-torch2.13.0+cpu-ee14a026');
INSERT INTO events VALUES(6,1796236921708,'mlp',5,'load_started','loading the cached build for model.cpu.linux-x86_64-avx2-torch2.13.0+cpu-ee14a026');
INSERT INTO events VALUES(7,1796236922092,'mlp',5,'loaded','loaded from cache on cpu');
INSERT INTO events VALUES(8,1796236950934,'embed',1,'build_ready','built in 29220 ms');
INSERT INTO events VALUES(9,1796236950939,'embed',1,'loaded','loaded after build on cpu');
CREATE TABLE IF NOT EXISTS "builds"(
      artifact TEXT NOT NULL REFERENCES artifacts(sha256) ON DELETE CASCADE,
      package_model TEXT NOT NULL,
      fingerprint TEXT NOT NULL,
      device TEXT NOT NULL,
      options TEXT NOT NULL DEFAULT '',
      state TEXT NOT NULL,
      error TEXT NOT NULL DEFAULT '',
      started_at_ms INTEGER NOT NULL DEFAULT 0,
      finished_at_ms INTEGER NOT NULL DEFAULT 0,
      progress TEXT NOT NULL DEFAULT '',
      attempts INTEGER NOT NULL DEFAULT 0,
      PRIMARY KEY(artifact, package_model, fingerprint, device, options));
INSERT INTO builds VALUES('ef31eec8f571d5d134b3e51bb9581485b5f5fe745f61a36440de1245392a12e8','model','linux-x86_64-avx2-torch2.13.0+cpu-ee14a026','cpu','','ready','',1796236921706,1796236950933,'',1);
INSERT INTO builds VALUES('5e47cc982ef8d45c39c9ee51902ad95830b5aa6298d98246972ee34ff661bbee','model','linux-x86_64-avx2-torch2.13.0+cpu-ee14a026','cpu','','ready','',1796236878038,1796236910764,'',1);
DELETE FROM sqlite_sequence;
INSERT INTO sqlite_sequence VALUES('events',9);
CREATE INDEX versions_by_artifact ON versions(artifact);
CREATE INDEX events_by_model ON events(model, id);
COMMIT;

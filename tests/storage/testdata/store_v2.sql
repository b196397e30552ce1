-- A store written by aotid at schema version 2 (commit 705540b): mlp:1 and
-- mlp:5 share one artifact, embed:1 has num_runners=2, and the daemon built
-- both artifacts once. Made with `sqlite3 aotid.db .dump`; the migration
-- test loads it and opens it with the current binary. Never edit it: add a
-- store_vN.sql for each new schema version instead.
PRAGMA user_version=2;
PRAGMA foreign_keys=OFF;
BEGIN TRANSACTION;
CREATE TABLE artifacts(
      sha256 TEXT PRIMARY KEY CHECK(length(sha256) = 64),
      kind TEXT NOT NULL,
      size INTEGER NOT NULL,
      added_at_ms INTEGER NOT NULL);
INSERT INTO artifacts VALUES('2770faf2a6d1901196813b51e02674038401768f2cf1efb3e0020f12aad73065','exported_program',12543,1796231158652);
INSERT INTO artifacts VALUES('d889c3b5715cc3283d7686ffe4594150adc87cbacf0eb0d971b0135b4aecf522','exported_program',9792,1796231158660);
CREATE TABLE models(
      id INTEGER PRIMARY KEY,
      name TEXT NOT NULL UNIQUE,
      created_at_ms INTEGER NOT NULL, version_policy TEXT NOT NULL DEFAULT 'latest');
INSERT INTO models VALUES(1,'mlp',1796231158652,'latest');
INSERT INTO models VALUES(2,'embed',1796231158660,'latest');
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
      CHECK(max_batch_delay_us >= 0),
      PRIMARY KEY(model_id, version));
INSERT INTO versions VALUES(1,1,'2770faf2a6d1901196813b51e02674038401768f2cf1efb3e0020f12aad73065','model','auto',1,1796231158652,1,1,0);
INSERT INTO versions VALUES(2,1,'d889c3b5715cc3283d7686ffe4594150adc87cbacf0eb0d971b0135b4aecf522','model','auto',2,1796231158660,1,1,0);
INSERT INTO versions VALUES(1,5,'2770faf2a6d1901196813b51e02674038401768f2cf1efb3e0020f12aad73065','model','auto',1,1796231158670,1,1,0);
CREATE TABLE builds(
      artifact TEXT NOT NULL REFERENCES artifacts(sha256) ON DELETE CASCADE,
      package_model TEXT NOT NULL,
      fingerprint TEXT NOT NULL,
      device TEXT NOT NULL,
      state TEXT NOT NULL,
      error TEXT NOT NULL DEFAULT '',
      started_at_ms INTEGER NOT NULL DEFAULT 0,
      finished_at_ms INTEGER NOT NULL DEFAULT 0,
      PRIMARY KEY(artifact, package_model, fingerprint));
INSERT INTO builds VALUES('d889c3b5715cc3283d7686ffe4594150adc87cbacf0eb0d971b0135b4aecf522','model','linux-x86_64-avx512-torch2.13.0+cpu-e1e5401c','cpu','ready','',1796231158685,1796231174571);
INSERT INTO builds VALUES('2770faf2a6d1901196813b51e02674038401768f2cf1efb3e0020f12aad73065','model','linux-x86_64-avx512-torch2.13.0+cpu-e1e5401c','cpu','ready','',1796231174573,1796231185420);
CREATE TABLE events(
      id INTEGER PRIMARY KEY AUTOINCREMENT,
      at_ms INTEGER NOT NULL,
      model TEXT NOT NULL DEFAULT '',
      version INTEGER NOT NULL DEFAULT 0,
      kind TEXT NOT NULL,
      message TEXT NOT NULL);
INSERT INTO events VALUES(1,1796231158652,'mlp',1,'added','added /work/main/build/testdata/mlp.pt2 as sha256:2770faf2a6d1');
INSERT INTO events VALUES(2,1796231158660,'embed',1,'added','added /work/main/build/testdata/embed.pt2 as sha256:d889c3b5715c');
INSERT INTO events VALUES(3,1796231158670,'mlp',5,'added','added /work/main/build/testdata/mlp.pt2 as sha256:2770faf2a6d1');
INSERT INTO events VALUES(4,1796231158683,'embed',1,'build_queued','queued for a build for cpu');
INSERT INTO events VALUES(5,1796231158689,'embed',1,'build_started','compiling for cpu on linux-x86_64-avx512-torch2.13.0+cpu-e1e5401c');
INSERT INTO events VALUES(6,1796231158690,'mlp',5,'build_queued','queued for a build for cpu');
INSERT INTO events VALUES(7,1796231174571,'embed',1,'build_ready','built in 15884 ms');
INSERT INTO events VALUES(8,1796231174573,'mlp',5,'build_started','compiling for cpu on linux-x86_64-avx512-torch2.13.0+cpu-e1e5401c');
INSERT INTO events VALUES(9,1796231174758,'embed',1,'loaded','loaded after build on cpu');
INSERT INTO events VALUES(10,1796231185420,'mlp',5,'build_ready','built in 10845 ms');
INSERT INTO events VALUES(11,1796231185422,'mlp',5,'loaded','loaded after build on cpu');
DELETE FROM sqlite_sequence;
INSERT INTO sqlite_sequence VALUES('events',11);
CREATE INDEX versions_by_artifact ON versions(artifact);
CREATE INDEX events_by_model ON events(model, id);
COMMIT;

-- A store written by aotid at schema version 1 (commit 26b7d83): mlp:1 and
-- mlp:5 share one artifact, embed:1 has num_runners=2, and the daemon built
-- both artifacts once. Made with `sqlite3 aotid.db .dump`; the migration
-- test loads it and opens it with the current binary. Never edit it: add a
-- store_vN.sql for each new schema version instead.
PRAGMA user_version=1;
PRAGMA foreign_keys=OFF;
BEGIN TRANSACTION;
CREATE TABLE artifacts(
      sha256 TEXT PRIMARY KEY CHECK(length(sha256) = 64),
      kind TEXT NOT NULL,
      size INTEGER NOT NULL,
      added_at_ms INTEGER NOT NULL);
INSERT INTO artifacts VALUES('0cded52fd971d56bb81cb0931c4b27312cf5c1f284e43e4e6e4c51de653566c7','exported_program',12543,1796227564351);
INSERT INTO artifacts VALUES('54eab1e76931baea49e4dc23e881d930a8716a3e574b506166492a82d7b84e2b','exported_program',9792,1796227564567);
CREATE TABLE models(
      id INTEGER PRIMARY KEY,
      name TEXT NOT NULL UNIQUE,
      created_at_ms INTEGER NOT NULL);
INSERT INTO models VALUES(1,'mlp',1796227564351);
INSERT INTO models VALUES(2,'embed',1796227564567);
CREATE TABLE versions(
      model_id INTEGER NOT NULL REFERENCES models(id) ON DELETE CASCADE,
      version INTEGER NOT NULL CHECK(version >= 1),
      artifact TEXT NOT NULL REFERENCES artifacts(sha256),
      package_model TEXT NOT NULL DEFAULT 'model',
      device TEXT NOT NULL DEFAULT 'auto',
      num_runners INTEGER NOT NULL DEFAULT 1,
      created_at_ms INTEGER NOT NULL,
      PRIMARY KEY(model_id, version));
INSERT INTO versions VALUES(1,1,'0cded52fd971d56bb81cb0931c4b27312cf5c1f284e43e4e6e4c51de653566c7','model','auto',1,1796227564351);
INSERT INTO versions VALUES(2,1,'54eab1e76931baea49e4dc23e881d930a8716a3e574b506166492a82d7b84e2b','model','auto',2,1796227564567);
INSERT INTO versions VALUES(1,5,'0cded52fd971d56bb81cb0931c4b27312cf5c1f284e43e4e6e4c51de653566c7','model','auto',1,1796227564778);
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
INSERT INTO builds VALUES('54eab1e76931baea49e4dc23e881d930a8716a3e574b506166492a82d7b84e2b','model','linux-x86_64-avx512-torch2.13.0+cpu-e1e5401c','cpu','ready','',0,1796227580276);
INSERT INTO builds VALUES('0cded52fd971d56bb81cb0931c4b27312cf5c1f284e43e4e6e4c51de653566c7','model','linux-x86_64-avx512-torch2.13.0+cpu-e1e5401c','cpu','ready','',0,1796227590363);
CREATE TABLE events(
      id INTEGER PRIMARY KEY AUTOINCREMENT,
      at_ms INTEGER NOT NULL,
      model TEXT NOT NULL DEFAULT '',
      version INTEGER NOT NULL DEFAULT 0,
      kind TEXT NOT NULL,
      message TEXT NOT NULL);
INSERT INTO events VALUES(1,1796227564352,'mlp',1,'added','added /work/main/build/testdata/mlp.pt2 as sha256:0cded52fd971');
INSERT INTO events VALUES(2,1796227564567,'embed',1,'added','added /work/main/build/testdata/embed.pt2 as sha256:54eab1e76931');
INSERT INTO events VALUES(3,1796227564778,'mlp',5,'added','added /work/main/build/testdata/mlp.pt2 as sha256:0cded52fd971');
INSERT INTO events VALUES(4,1796227565002,'embed',1,'build_started','compiling for cpu on linux-x86_64-avx512-torch2.13.0+cpu-e1e5401c');
INSERT INTO events VALUES(5,1796227580276,'embed',1,'build_ready','built in 15278 ms');
INSERT INTO events VALUES(6,1796227580281,'mlp',5,'build_started','compiling for cpu on linux-x86_64-avx512-torch2.13.0+cpu-e1e5401c');
INSERT INTO events VALUES(7,1796227580281,'embed',1,'loaded','loaded after build on cpu');
INSERT INTO events VALUES(8,1796227590363,'mlp',5,'build_ready','built in 10084 ms');
INSERT INTO events VALUES(9,1796227590365,'mlp',5,'loaded','loaded after build on cpu');
DELETE FROM sqlite_sequence;
INSERT INTO sqlite_sequence VALUES('events',9);
COMMIT;

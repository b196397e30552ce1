#include "storage/sqlite.h"

#include "test_util.h"

namespace aotid::storage {
namespace {

using testing::TempDir;

// A real database file with one constraint of each kind.
class SqliteErrorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto db = Db::Open(dir_ / "t.db", /*create=*/true);
    ASSERT_TRUE(db.ok()) << db.status().ToString();
    db_ = std::move(db).value();
    ASSERT_OK(
        db_->Exec("CREATE TABLE parent(id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE);"
                  "CREATE TABLE child(parent_id INTEGER NOT NULL REFERENCES parent(id),"
                  "                   n INTEGER NOT NULL CHECK(n >= 1));"
                  "INSERT INTO parent VALUES(1, 'a');"));
  }

  TempDir dir_;
  std::unique_ptr<Db> db_;
};

TEST_F(SqliteErrorTest, ATakenUniqueOrPrimaryKeyIsAlreadyExists) {
  EXPECT_EQ(db_->Exec("INSERT INTO parent VALUES(2, 'a')").code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(db_->Exec("INSERT INTO parent VALUES(1, 'b')").code(), StatusCode::kAlreadyExists);
}

TEST_F(SqliteErrorTest, AFailedCheckIsInvalidArgumentNotAlreadyExists) {
  Status s = db_->Exec("INSERT INTO child VALUES(1, 0)");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("CHECK constraint failed"), std::string::npos) << s.message();
}

TEST_F(SqliteErrorTest, AMissingNotNullValueIsInvalidArgument) {
  auto stmt = db_->Prepare("INSERT INTO child(parent_id) VALUES(?)");
  ASSERT_TRUE(stmt.ok()) << stmt.status().ToString();
  Status s = stmt->Bind(1, int64_t{1}).Run();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("NOT NULL constraint failed"), std::string::npos) << s.message();
}

TEST_F(SqliteErrorTest, ABrokenForeignKeyIsInternalNotAlreadyExists) {
  // Db::Open turns foreign keys on; a dangling reference is a bug in the
  // store's own writes.
  Status s = db_->Exec("INSERT INTO child VALUES(99, 1)");
  EXPECT_EQ(s.code(), StatusCode::kInternal) << s.ToString();
  EXPECT_NE(s.message().find("FOREIGN KEY constraint failed"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace aotid::storage

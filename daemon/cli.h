// The `aotid` command line. Exit codes scripts can rely on:
//   0 success
//   1 the operation failed (I/O, a build, an internal error)
//   2 usage or configuration error
//   3 not found (a model, a file, a store)
//   4 already exists (a model version)
//   5 invalid input (a file that is not a package, a bad name)
#pragma once

#include <functional>
#include <string>

namespace aotid::daemon {

int RunCli(int argc, char** argv);

// Root changing a store another user owns (`sudo aotid --store
// /var/lib/aotid add ...` for the system service, which runs as its own
// user): every file root made in it is given to the store's owner, so that
// the service can still write its store and remove what root added. A
// no-op unless run as root on a store root does not own.
//
// The store's owner can change its tree while this runs, so the walk goes
// by directory descriptors and never follows a link: a folder swapped for
// a link meanwhile is skipped, never entered, and root's chown cannot be
// sent outside the store. `before_entering` (a test's) runs with each
// folder's path just before it is opened.
void GiveStoreToItsOwner(const std::string& store_path,
                         const std::function<void(const std::string& path)>& before_entering = nullptr);

}  // namespace aotid::daemon

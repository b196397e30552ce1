// Where aotid finds its own parts: the torch plugin, the compile worker,
// the Python that runs it and the torch it links. All of it is found from
// the running executable's own path, so an install can be moved and a wheel
// installed anywhere; nothing points at the machine aotid was built on.
//
// Two layouts are known:
//   an install (cmake --install, or the wheel in a venv or prefix):
//     PREFIX/bin/aotid
//     PREFIX/lib/aotid/libaotid_torch.so
//     PREFIX/lib/aotid/python/{aotid_worker,aotid_export}/
//     PREFIX/lib/pythonX.Y/site-packages/torch/   (torch==the pinned version)
//   a build tree inside the checkout (./dev): CHECKOUT/BUILD/aotid, with the
//     plugin beside it, CHECKOUT/python/ and the venv at CHECKOUT/.venv.
#pragma once

#include <string>
#include <vector>

namespace aotid::platform {

// The directory of the running executable ("" if it cannot be read).
std::string ExecutableDir();

// Paths to try for the torch plugin, best first.
std::vector<std::string> PluginCandidates();

// The directory holding aotid_worker/ (PYTHONPATH for builds), or "" when
// neither layout has one.
std::string DefaultWorkerDir();

// The Python that runs the compile worker: the one installed beside aotid
// (a venv's bin/), else the checkout's .venv, else "python3" from PATH.
std::string DefaultPython();

// torch's package directory (include/, lib/), read off the libc10 the
// process has loaded; "" before the torch plugin is loaded.
std::string LoadedTorchDir();

}  // namespace aotid::platform

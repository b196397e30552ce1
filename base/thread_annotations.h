// Annotations for clang's thread-safety analysis (-Wthread-safety): which
// mutex guards a member, which mutex a function needs held or must not
// hold, which functions take and let go of one. Under clang they become the
// attributes the analysis reads; other compilers see nothing.
//
// The analysis needs a mutex type that says it is a capability; std::mutex
// in libstdc++ does not, so locks that guard annotated state are
// aotid::Mutex (base/mutex.h). `./dev lint` runs the analysis.
//
//   Mutex mu_;
//   std::deque<Job> queue_ GUARDED_BY(mu_);
//   void Drain() REQUIRES(mu_);   // caller holds mu_
//   void Push(Job j) EXCLUDES(mu_);  // takes mu_ itself
#pragma once

#if defined(__clang__)
#define AOTID_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define AOTID_THREAD_ANNOTATION(x)
#endif

// abseil's legacy header (which grpcpp includes) defines GUARDED_BY,
// PT_GUARDED_BY and NO_THREAD_SAFETY_ANALYSIS as the same attributes;
// these definitions replace its own rather than warn about them.
#undef GUARDED_BY
#undef PT_GUARDED_BY
#undef NO_THREAD_SAFETY_ANALYSIS

// A type that is a lock (a "capability" in clang's words).
#define CAPABILITY(name) AOTID_THREAD_ANNOTATION(capability(name))
// An RAII type that holds a capability for its lifetime.
#define SCOPED_CAPABILITY AOTID_THREAD_ANNOTATION(scoped_lockable)

// Data read or written only with the given mutex held.
#define GUARDED_BY(mu) AOTID_THREAD_ANNOTATION(guarded_by(mu))
// A pointer whose pointee is read or written only with the mutex held.
#define PT_GUARDED_BY(mu) AOTID_THREAD_ANNOTATION(pt_guarded_by(mu))

// The caller must hold the mutex (exclusively).
#define REQUIRES(...) AOTID_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
// The caller must not hold the mutex: the function takes it.
#define EXCLUDES(...) AOTID_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))

// The function takes (ACQUIRE) or lets go of (RELEASE) the mutex; without
// an argument, the object it is called on.
#define ACQUIRE(...) AOTID_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define RELEASE(...) AOTID_THREAD_ANNOTATION(release_capability(__VA_ARGS__))

// For code the analysis cannot follow; say why next to each use.
#define NO_THREAD_SAFETY_ANALYSIS AOTID_THREAD_ANNOTATION(no_thread_safety_analysis)

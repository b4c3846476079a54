//===- moe-reduce.cpp - moe-mlir test case reducer ----------*- C++ -*-===//
//
// mlir-reduce with the dialects and passes of moe-opt, so that a failing
// moe-opt input can be cut down:
//
//   moe-reduce bad.mlir --reduction-tree='traversal-mode=0 test=check.sh'
//
// The interestingness script gets the candidate file as its last argument and
// must exit 1 when the candidate is still interesting. Two things upstream
// mlir-reduce leaves to the user are checked here:
//   - the script must find the input itself interesting, or there is nothing
//     to reduce: said, with the script's exit status, instead of a silent
//     exit 1;
//   - each run of the script gets --test-timeout seconds (default 60), so a
//     candidate that hangs it counts as not interesting instead of hanging
//     the reduction. moe-reduce runs the script through itself for that.
//
//===----------------------------------------------------------------------===//

#include "moe/InitAll.h"

#include "mlir/IR/DialectRegistry.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Tools/mlir-reduce/MlirReduceMain.h"
#include "mlir/Transforms/Passes.h"
#include "llvm/ADT/SmallVector.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Program.h"
#include "llvm/Support/raw_ostream.h"

#include <cerrno>
#include <chrono>
#include <csignal>
#include <optional>
#include <string>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

namespace {

/// argv[1] of moe-reduce running one test under the time limit:
/// moe-reduce --run-test-with-timeout SECONDS SCRIPT ARGS... FILE
constexpr llvm::StringLiteral kRunTest = "--run-test-with-timeout";
constexpr unsigned kDefaultTimeout = 60;

/// Runs `program` with `args` in a process group of its own for at most
/// `seconds` (0: no limit), then kills what is left of the group (a test
/// that starts a hanging child must not hold the reduction). Returns the
/// exit status, or -1 when it ran out of time, crashed or did not start
/// (`error` says which).
int runTest(llvm::StringRef program, llvm::ArrayRef<llvm::StringRef> args,
            unsigned seconds, std::string &error) {
  std::string path = program.str();
  if (llvm::ErrorOr<std::string> found = llvm::sys::findProgramByName(program))
    path = *found;
  std::vector<std::string> storage = {program.str()};
  for (llvm::StringRef arg : args)
    storage.push_back(arg.str());
  std::vector<char *> argv;
  for (std::string &arg : storage)
    argv.push_back(arg.data());
  argv.push_back(nullptr);

  pid_t pid = ::fork();
  if (pid < 0) {
    error = "cannot start a process";
    return -1;
  }
  if (pid == 0) {
    ::setpgid(0, 0);
    ::execv(path.c_str(), argv.data());
    ::_exit(127);
  }
  ::setpgid(pid, pid);
  auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  int status = 0;
  while (true) {
    pid_t done = ::waitpid(pid, &status, WNOHANG);
    if (done == pid)
      break;
    if (done < 0 && errno != EINTR) {
      error = "lost the process";
      ::kill(-pid, SIGKILL);
      return -1;
    }
    if (seconds && std::chrono::steady_clock::now() > deadline) {
      ::kill(-pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      error = "timed out after " + std::to_string(seconds) + " s";
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ::kill(-pid, SIGKILL);
  if (WIFEXITED(status)) {
    if (WEXITSTATUS(status) == 127)
      error = "exit 127: not found or not executable";
    return WEXITSTATUS(status);
  }
  error = "killed by signal " + std::to_string(WTERMSIG(status));
  return -1;
}

/// The words of a pass option string: `a=1 test=x.sh test-arg={p q}`.
std::vector<std::string> splitOptions(llvm::StringRef text) {
  std::vector<std::string> words;
  std::string word;
  char quote = 0;
  int braces = 0;
  for (char c : text) {
    if (quote) {
      quote = c == quote ? 0 : quote;
    } else if (c == '\'' || c == '"') {
      quote = c;
    } else if (c == '{') {
      ++braces;
    } else if (c == '}') {
      --braces;
    } else if (c == ' ' && braces == 0) {
      if (!word.empty())
        words.push_back(std::move(word));
      word.clear();
      continue;
    }
    word += c;
  }
  if (!word.empty())
    words.push_back(std::move(word));
  return words;
}

/// The test of one reduction pass's options, and the options rewritten so
/// that moe-reduce runs it under the time limit.
struct TestOptions {
  std::string script;
  std::vector<std::string> args;
  std::string rewritten;
};

std::optional<TestOptions> findTest(llvm::StringRef options,
                                    llvm::StringRef self, unsigned timeout) {
  TestOptions test;
  std::vector<std::string> kept;
  for (std::string &word : splitOptions(options)) {
    llvm::StringRef w = word;
    if (w.consume_front("test=")) {
      test.script = w.trim("'\"").str();
    } else if (w.consume_front("test-arg=")) {
      llvm::SmallVector<llvm::StringRef> args;
      w.trim("'\"{}").split(args, ',');
      for (llvm::StringRef arg : args)
        test.args.push_back(arg.str());
    } else {
      kept.push_back(word);
    }
  }
  if (test.script.empty())
    return std::nullopt;
  // A script or argument with a comma or a space does not survive the
  // rewritten list option: then the options stay as they are.
  auto plain = [](llvm::StringRef s) {
    return !s.empty() && !s.contains(',') && !s.contains(' ');
  };
  bool rewritable =
      plain(self) && plain(test.script) && llvm::all_of(test.args, plain);
  if (!rewritable) {
    test.rewritten = options.str();
    return test;
  }
  kept.push_back("test=" + self.str());
  std::string args = "test-arg=" + kRunTest.str() + "," +
                     std::to_string(timeout) + "," + test.script;
  for (const std::string &arg : test.args)
    args += "," + arg;
  kept.push_back(args);
  test.rewritten = llvm::join(kept, " ");
  return test;
}

} // namespace

int main(int argc, char **argv) {
  if (argc >= 4 && llvm::StringRef(argv[1]) == kRunTest) {
    unsigned seconds = 0;
    if (llvm::StringRef(argv[2]).getAsInteger(10, seconds))
      return 2;
    llvm::SmallVector<llvm::StringRef> args(argv + 4, argv + argc);
    std::string error;
    int status = runTest(argv[3], args, seconds, error);
    // Out of time, crashed or not run: not interesting (only 1 is).
    return status < 0 ? 0 : status;
  }

  // moe-reduce's own option, taken out before mlir-reduce parses the rest.
  unsigned timeout = kDefaultTimeout;
  std::vector<std::string> words;
  for (int i = 1; i < argc; ++i) {
    llvm::StringRef arg = argv[i];
    if (arg.consume_front("--test-timeout=") ||
        arg.consume_front("-test-timeout=")) {
      if (arg.getAsInteger(10, timeout)) {
        llvm::errs() << "moe-reduce: error: --test-timeout takes whole "
                        "seconds (0: no limit), got '"
                     << arg << "'\n";
        return 2;
      }
      continue;
    }
    words.push_back(argv[i]);
  }

  // The input file, and the reduction pass's test, rewritten to run under
  // the time limit.
  static int anchor;
  std::string self = llvm::sys::fs::getMainExecutable(argv[0], &anchor);
  std::string input;
  std::optional<TestOptions> test;
  for (size_t i = 0; i < words.size(); ++i) {
    llvm::StringRef arg = words[i];
    if (arg == "-o" || arg == "--o") {
      ++i; // the output file
      continue;
    }
    if (!arg.starts_with("-")) {
      if (input.empty())
        input = arg.str();
      continue;
    }
    llvm::StringRef option = arg.ltrim('-');
    for (llvm::StringRef pass : {"reduction-tree=", "opt-reduction-pass="}) {
      if (!option.consume_front(pass))
        continue;
      if ((test = findTest(option, self, timeout)))
        words[i] =
            (arg.take_front(arg.size() - option.size()) + test->rewritten)
                .str();
      break;
    }
  }

  if (test && !input.empty() && input != "-") {
    llvm::SmallVector<llvm::StringRef> args;
    for (const std::string &arg : test->args)
      args.push_back(arg);
    args.push_back(input);
    std::string error;
    int status = runTest(test->script, args, timeout, error);
    if (status != 1) {
      llvm::errs() << "moe-reduce: error: the test does not find the input "
                      "interesting, so there is nothing to reduce: "
                   << test->script;
      for (llvm::StringRef arg : args)
        llvm::errs() << " " << arg;
      if (status < 0)
        llvm::errs() << " did not finish (" << error << ")";
      else
        llvm::errs() << " exited with " << status;
      llvm::errs() << "; it must exit 1 for an interesting input";
      if (timeout)
        llvm::errs() << " within --test-timeout=" << timeout << " s";
      llvm::errs() << "\n";
      return 1;
    }
  }

  std::vector<char *> newArgv = {argv[0]};
  for (std::string &word : words)
    newArgv.push_back(word.data());
  int newArgc = static_cast<int>(newArgv.size());
  newArgv.push_back(nullptr);

  mlir::DialectRegistry registry;
  mlir::moe::registerAllMoEToolDialects(registry);
  mlir::registerTransformsPasses();
  mlir::moe::registerAllMoEPasses();
  mlir::MLIRContext context(registry);
  return mlir::failed(mlir::mlirReduceMain(newArgc, newArgv.data(), context));
}

// Catch2's implementation without its main (libFuzzer has the main), and a result capture
// so that the fake provider's REQUIRE/CHECK work outside a test run.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <string_view>

namespace fuzz {

void install_catch_capture();  // fuzz_support.hpp

namespace {

[[noreturn]] void assertion_failed(const Catch::AssertionInfo& info, std::string_view what) {
  std::fprintf(stderr, "%s:%zu: the fake provider's %s failed: %s %.*s\n", info.lineInfo.file,
               info.lineInfo.line, info.macroName.c_str(), info.capturedExpression.c_str(),
               static_cast<int>(what.size()), what.data());
  std::abort();
}

[[noreturn]] void unsupported(const char* what) {
  std::fprintf(stderr, "fuzz: Catch2 %s is not available outside a test run\n", what);
  std::abort();
}

class AbortingCapture final : public Catch::IResultCapture {
 public:
  bool sectionStarted(Catch::SectionInfo const&, Catch::Counts&) override { unsupported("SECTION"); }
  void sectionEnded(Catch::SectionEndInfo const&) override {}
  void sectionEndedEarly(Catch::SectionEndInfo const&) override {}
  auto acquireGeneratorTracker(Catch::StringRef, Catch::SourceLineInfo const&)
      -> Catch::IGeneratorTracker& override {
    unsupported("GENERATE");
  }
  void pushScopedMessage(Catch::MessageInfo const&) override {}
  void popScopedMessage(Catch::MessageInfo const&) override {}
  void emplaceUnscopedMessage(Catch::MessageBuilder const&) override {}
  void handleFatalErrorCondition(Catch::StringRef message) override {
    std::fprintf(stderr, "fuzz: fatal condition %s\n", std::string(message).c_str());
    std::abort();
  }
  void handleExpr(Catch::AssertionInfo const& info, Catch::ITransientExpression const& expr,
                  Catch::AssertionReaction&) override {
    if (!expr.getResult() && !Catch::isFalseTest(info.resultDisposition)) {
      std::ostringstream text;
      expr.streamReconstructedExpression(text);
      assertion_failed(info, "with " + text.str());
    }
    if (expr.getResult() && Catch::isFalseTest(info.resultDisposition))
      assertion_failed(info, "(expected false)");
    last_passed_ = true;
  }
  void handleMessage(Catch::AssertionInfo const& info, Catch::ResultWas::OfType type,
                     Catch::StringRef const& message, Catch::AssertionReaction&) override {
    if (!Catch::isOk(type)) assertion_failed(info, std::string(message));
  }
  void handleUnexpectedExceptionNotThrown(Catch::AssertionInfo const& info,
                                          Catch::AssertionReaction&) override {
    assertion_failed(info, "no exception was thrown");
  }
  void handleUnexpectedInflightException(Catch::AssertionInfo const& info, std::string const& message,
                                         Catch::AssertionReaction&) override {
    assertion_failed(info, "exception: " + message);
  }
  void handleIncomplete(Catch::AssertionInfo const& info) override { assertion_failed(info, "incomplete"); }
  void handleNonExpr(Catch::AssertionInfo const& info, Catch::ResultWas::OfType type,
                     Catch::AssertionReaction&) override {
    if (!Catch::isOk(type)) assertion_failed(info, "");
    last_passed_ = true;
  }
  bool lastAssertionPassed() override { return last_passed_; }
  void assertionPassed() override { last_passed_ = true; }
  std::string getCurrentTestName() const override { return "fuzz"; }
  const Catch::AssertionResult* getLastResult() const override { return nullptr; }
  void exceptionEarlyReported() override {}

 private:
  bool last_passed_ = true;
};

}  // namespace

void install_catch_capture() {
  static AbortingCapture capture;
  Catch::getCurrentMutableContext().setResultCapture(&capture);
}

}  // namespace fuzz

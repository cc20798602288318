// Sets a sysctl of this (virtual) machine's kernel for a scope: the old value is written
// back when the scope ends. Used in the VM only; a failure to read or write the value
// throws std::runtime_error (a failed Catch2 test case, a FAIL line of a scenario).
#pragma once

#include <fstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace rpmapp_tests {

class Sysctl {
 public:
  Sysctl(std::string path, const std::string& value) : path_(std::move(path)), old_(read()) { write(value); }
  ~Sysctl() { std::ofstream(path_) << old_ << '\n'; }
  Sysctl(const Sysctl&) = delete;
  Sysctl& operator=(const Sysctl&) = delete;

 private:
  std::string read() const {
    std::ifstream in(path_);
    std::string v;
    if (!std::getline(in, v)) throw std::runtime_error("cannot read " + path_);
    return v;
  }
  void write(const std::string& v) const {
    std::ofstream out(path_);
    out << v << '\n';
    out.close();
    if (!out) throw std::runtime_error("cannot write " + v + " to " + path_);
  }
  std::string path_;
  std::string old_;
};

}  // namespace rpmapp_tests

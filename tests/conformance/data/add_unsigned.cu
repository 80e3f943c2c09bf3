// A device function with C linkage, built into each kind of linkable code by the tests
// (PTX, relocatable cubin, fatbin, LTO-IR) (kjit conformance data).
extern "C" __device__
unsigned int add_unsigned(unsigned int a, unsigned int b)
{
  return a + b;
}

// Does not compile: the second line of the body is not C++ (kjit conformance data).
extern "C" __device__
int doubled_into(int *out, int a)
{
  THIS IS NOT CODE
  *out = a * 2;
  return 0;
}

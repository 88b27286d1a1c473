// ringtrain command line: train, eval, prepare.
#include <cstdio>
int main() { std::puts("ringtrain: under construction"); return 0; }
